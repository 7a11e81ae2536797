// Live countdown for [data-remaining] elements, and the self-refreshing list
// of /reservations. The server renders the seconds left from the database
// clock; this only counts down from when they arrived with performance.now(),
// never reading the browser's wall clock. No framework: the list is
// refreshed by fetching the same page and swapping its #live section.
(function () {
  "use strict";
  var SOON = 120;
  var els = [];
  var start = 0;
  function fmt(s) {
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    var mm = h > 0 ? (m < 10 ? "0" + m : "" + m) : "" + m;
    return (h > 0 ? h + ":" : "") + mm + ":" + (sec < 10 ? "0" + sec : sec);
  }
  function collect() {
    start = performance.now();
    els = Array.prototype.slice.call(document.querySelectorAll("[data-remaining]"));
  }
  // Urgency is said in words as well as colour: "Expires soon", "Overdue".
  function badge(el, cls, text) {
    var b = el.parentNode && el.parentNode.querySelector(".badge." + cls);
    if (!b) {
      b = document.createElement("span");
      b.className = "badge " + cls;
      b.textContent = text;
      el.parentNode.appendChild(document.createTextNode(" "));
      el.parentNode.appendChild(b);
    }
  }
  function tick() {
    var elapsed = Math.floor((performance.now() - start) / 1000);
    els.forEach(function (el) {
      var left = parseInt(el.getAttribute("data-remaining"), 10) - elapsed;
      if (isNaN(left)) { return; }
      if (left <= 0) {
        el.textContent = "0:00";
        el.classList.add("overdue");
        var soon = el.parentNode && el.parentNode.querySelector(".badge.soon");
        if (soon) { soon.remove(); }
        badge(el, "overdue", "Overdue");
      } else {
        el.textContent = fmt(left);
        if (left < SOON) { el.classList.add("soon"); badge(el, "soon", "Expires soon"); }
      }
    });
  }
  collect();
  tick();
  setInterval(tick, 250);

  var live = document.getElementById("live");
  var every = live ? parseInt(live.getAttribute("data-refresh"), 10) : 0;
  if (!live || !(every > 0) || !window.fetch || !window.DOMParser) { return; }
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (res) {
        if (!res.ok || res.redirected) { throw new Error("status " + res.status); }
        return res.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        if (!fresh) { throw new Error("no list in the answer"); }
        live.innerHTML = fresh.innerHTML;
        collect();
        tick();
      })
      .catch(function () {
        var at = live.querySelector(".refreshed-at");
        if (at && !/refresh failed/.test(at.textContent)) {
          at.textContent += " (the last refresh failed: reload the page)";
        }
      });
  }
  setInterval(refresh, every * 1000);
})();
