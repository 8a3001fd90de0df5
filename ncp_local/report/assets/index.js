
document.querySelectorAll('table.sortable').forEach(function(table){
  table.querySelectorAll('th').forEach(function(th, col){
    th.classList.add('sortable');
    th.addEventListener('click', function(){
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var dir = th.dataset.dir === 'asc' ? -1 : 1; th.dataset.dir = dir > 0 ? 'asc' : 'desc';
      rows.sort(function(a, b){
        var x = a.cells[col].dataset.v || a.cells[col].textContent, y = b.cells[col].dataset.v || b.cells[col].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        if (!isNaN(nx) && !isNaN(ny)) return dir * (nx - ny);
        return dir * x.localeCompare(y);
      });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
});
document.querySelectorAll('.controls').forEach(function(ctl){
  var table = document.getElementById(ctl.dataset.table);
  var sel = ctl.querySelector('select'), box = ctl.querySelector('input'), count = ctl.querySelector('.count');
  function apply(){
    var term = sel.value, q = box.value.toLowerCase(), shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function(r){
      var ok = (!term || r.dataset.termination === term) && (!q || r.textContent.toLowerCase().indexOf(q) >= 0);
      r.style.display = ok ? '' : 'none'; if (ok) shown++;
    });
    count.textContent = shown + ' shown';
  }
  sel.addEventListener('change', apply); box.addEventListener('input', apply);
  apply();
});
