// Live countdown for [data-remaining] elements. The server renders the
// seconds left from the database clock; this only counts down from page
// load with performance.now(), never reading the browser's wall clock.
(function () {
  "use strict";
  var start = performance.now();
  var els = Array.prototype.slice.call(document.querySelectorAll("[data-remaining]"));
  if (els.length === 0) { return; }
  els.forEach(function (el) { el.dataset.start = el.getAttribute("data-remaining"); });
  function fmt(s) {
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    var mm = h > 0 ? (m < 10 ? "0" + m : "" + m) : "" + m;
    return (h > 0 ? h + ":" : "") + mm + ":" + (sec < 10 ? "0" + sec : sec);
  }
  function tick() {
    var elapsed = Math.floor((performance.now() - start) / 1000);
    els.forEach(function (el) {
      var left = parseInt(el.dataset.start, 10) - elapsed;
      if (isNaN(left)) { return; }
      if (left <= 0) {
        el.textContent = "0:00 (overdue, reload)";
        el.classList.add("overdue");
      } else {
        el.textContent = fmt(left);
      }
    });
  }
  tick();
  setInterval(tick, 250);
})();
