"""The record of a run: its directory's layout, files and formats, written by `execution` and read by
`report`, `analysis`, export and validation through these modules (issue 59)."""
