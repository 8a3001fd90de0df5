
var rows = JSON.parse(document.getElementById('sheet-data').textContent);
var columns = JSON.parse(document.getElementById('sheet-columns').textContent);
function cell(v){ v = String(v == null ? '' : v); return /[",\n\r]/.test(v) ? '"' + v.replace(/"/g, '""') + '"' : v; }
function filled(){
  var done = 0;
  rows.forEach(function(r){
    var pick = document.querySelector('input[name="verdict-' + r.item + '"]:checked');
    r.verdict = pick ? pick.value : '';
    r.note = document.getElementById('note-' + r.item).value;
    if (r.verdict) done++;
  });
  document.getElementById('progress').textContent = done + ' of ' + rows.length + ' reviewed';
  return rows;
}
document.querySelectorAll('input[type=radio]').forEach(function(el){ el.addEventListener('change', filled); });
document.getElementById('save').addEventListener('click', function(){
  var lines = [columns.join(',')];
  filled().forEach(function(r){ lines.push(columns.map(function(c){ return cell(r[c]); }).join(',')); });
  var blob = new Blob([lines.join('\n') + '\n'], {type: 'text/csv'});
  var a = document.createElement('a'); a.href = URL.createObjectURL(blob); a.download = 'review_filled.csv';
  document.body.appendChild(a); a.click(); a.remove();
});
filled();
