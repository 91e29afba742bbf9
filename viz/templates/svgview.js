/* paratrace report: pan, zoom and search for the report's SVG pictures.
 *
 * One file, copied once into the report directory and loaded by every page (no network, no
 * library). Each <div class="svgview"> holding an inline <svg> gets a toolbar and:
 *   drag: pan;  wheel: zoom at the pointer;  keys: + - zoom, arrows pan, 0 fit, 1 readable size;
 *   a graphviz graph also gets a search box: it highlights the nodes whose label or tooltip
 *   contains the text; Enter centres on the next one (/ focuses the box).
 * The view is the SVG's viewBox: zooming never re-lays out the picture. Without JavaScript the
 * box stays a plain scrollable picture.
 */
(function () {
  "use strict";
  var ZOOM_STEP = 1.25;      // per key press or button
  var PAN_STEP = 0.15;       // share of the visible width / height per arrow key
  var READABLE = 1.0;        // px per user unit where graphviz's 10 pt labels read well
  var DRAG_PX = 4;           // a press that moves less is a click (node links keep working)
  var views = [];
  var current = null;

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text) { node.textContent = text; }
    return node;
  }

  function View(box) {
    var svg = box.querySelector("svg");
    var vb = svg.viewBox && svg.viewBox.baseVal;
    var width = parseFloat(svg.getAttribute("width")) || (vb && vb.width) || 1;
    var height = parseFloat(svg.getAttribute("height")) || (vb && vb.height) || 1;
    this.box = box;
    this.svg = svg;
    this.full = vb && vb.width ? {x: vb.x, y: vb.y, w: vb.width, h: vb.height}
                               : {x: 0, y: 0, w: width, h: height};
    // graphviz sizes its pictures in pt: 1 user unit = 4/3 px at the picture's own size
    this.natural = /pt$/.test(svg.getAttribute("width") || "") ? 4 / 3 : 1;
    this.nodes = Array.prototype.filter.call(svg.querySelectorAll("g.node"), function (g) {
      var t = g.querySelector("title");
      return !(t && /^legend_/.test(t.textContent));
    }).map(function (g) {
      var texts = Array.prototype.map.call(g.querySelectorAll("text"),
                                           function (t) { return t.textContent; });
      var a = g.querySelector("a");
      var tip = a ? (a.getAttribute("xlink:title") || a.getAttribute("title") || "") : "";
      return {g: g, name: texts[0] || "", label: texts.join(" ").toLowerCase(),
              tip: tip.toLowerCase()};
    });
    this.graph = this.nodes.length > 0;
    this.matches = [];
    this.at = -1;
    this.toolbar();
    svg.setAttribute("width", "100%");
    svg.setAttribute("height", "100%");
    svg.setAttribute("preserveAspectRatio", "xMidYMid meet");
    box.classList.add("live");
    box.setAttribute("tabindex", "0");
    this.size(true);
    this.listen();
  }

  View.prototype.toolbar = function () {
    var self = this;
    var bar = el("div", {"class": "svgtools"});
    if (this.graph) {
      var listId = "svgview-names-" + views.length;
      this.search = el("input", {type: "search", placeholder: "find a function or op",
                                 "aria-label": "find a node", list: listId});
      var list = el("datalist", {id: listId});
      var seen = {};
      this.nodes.forEach(function (n) {
        if (n.name && !seen[n.name]) {
          seen[n.name] = true;
          list.appendChild(el("option", {value: n.name}));
        }
      });
      this.status = el("span", {"class": "svgstatus"});
      this.search.addEventListener("input", function () { self.find(self.search.value); });
      this.search.addEventListener("keydown", function (e) {
        if (e.key === "Enter") {
          e.preventDefault();
          if (!self.matches.length) { self.find(self.search.value); }
          self.next(e.shiftKey ? -1 : 1);
        } else if (e.key === "Escape") {
          self.search.value = "";
          self.find("");
          self.box.focus();
        }
      });
      bar.appendChild(this.search);
      bar.appendChild(list);
      bar.appendChild(this.status);
    }
    [["\u2212", "zoom out (-)", function () { self.zoomBy(1 / ZOOM_STEP); }],
     ["+", "zoom in (+)", function () { self.zoomBy(ZOOM_STEP); }],
     ["fit", "fit the whole picture (0)", function () { self.fit(); }],
     ["1:1", "readable size (1)", function () { self.readable(); }]].forEach(function (b) {
      var button = el("button", {type: "button", title: b[1]}, b[0]);
      button.addEventListener("click", function () { current = self; b[2](); });
      bar.appendChild(button);
    });
    bar.appendChild(el("span", {"class": "muted"},
                       "drag to pan, wheel to zoom; keys + - arrows, 0 fit" +
                       (this.graph ? ", / find" : "")));
    this.box.parentNode.insertBefore(bar, this.box);
  };

  // ---------------------------------------------------------------- geometry
  View.prototype.size = function (first) {
    var w = this.box.clientWidth || 800;
    var fitWidth = Math.min(this.natural, w / this.full.w);
    var limit = Math.max(240, 0.82 * window.innerHeight);
    var h = this.graph && fitWidth < READABLE ? this.full.h * READABLE
                                              : this.full.h * fitWidth;
    this.box.style.height = Math.round(Math.min(limit, Math.max(160, h))) + "px";
    this.w = this.box.clientWidth || w;
    this.h = this.box.clientHeight || h;
    this.fitScale = Math.min(this.w / this.full.w, this.h / this.full.h);
    if (first) {
      if (this.graph && this.fitScale < READABLE) { this.top(); } else { this.fit(); }
    } else {
      this.apply();
    }
  };

  View.prototype.apply = function () {
    var s = this.scale;
    var x = this.cx - this.w / (2 * s), y = this.cy - this.h / (2 * s);
    this.svg.setAttribute("viewBox", [x, y, this.w / s, this.h / s].map(function (v) {
      return v.toFixed(2);
    }).join(" "));
  };

  View.prototype.clamp = function (s) {
    return Math.max(Math.min(this.fitScale, READABLE) / 2, Math.min(8 * this.natural, s));
  };

  View.prototype.fit = function () {
    this.scale = this.fitScale;
    this.cx = this.full.x + this.full.w / 2;
    this.cy = this.full.y + this.full.h / 2;
    this.apply();
  };

  View.prototype.readable = function () {
    this.scale = this.clamp(this.graph ? READABLE : this.natural);
    this.apply();
  };

  // Readable size at the top of the picture, centred on its topmost node (a call graph's root).
  View.prototype.top = function () {
    this.scale = this.clamp(READABLE);
    this.cx = this.full.x + this.full.w / 2;
    this.cy = this.full.y + this.h / (2 * this.scale);
    this.apply();
    var best = null, bestTop = Infinity;
    this.nodes.forEach(function (n) {
      var r = n.g.getBoundingClientRect();
      if (r.top < bestTop) { bestTop = r.top; best = n; }
    });
    if (best) {
      this.cx = this.userPoint(this.centreOf(best.g)).x;
      this.apply();
    }
  };

  View.prototype.centreOf = function (g) {
    var r = g.getBoundingClientRect();
    return {x: r.left + r.width / 2, y: r.top + r.height / 2};
  };

  // screen (client) point -> user units, with the current viewBox
  View.prototype.userPoint = function (p) {
    var r = this.svg.getBoundingClientRect();
    return {x: this.cx + (p.x - (r.left + r.width / 2)) / this.scale,
            y: this.cy + (p.y - (r.top + r.height / 2)) / this.scale};
  };

  View.prototype.zoomBy = function (factor, at) {
    var s = this.clamp(this.scale * factor);
    if (at) {       // keep the user point under the pointer where it is
      var p = this.userPoint(at);
      this.cx = p.x - (p.x - this.cx) * this.scale / s;
      this.cy = p.y - (p.y - this.cy) * this.scale / s;
    }
    this.scale = s;
    this.apply();
  };

  View.prototype.panBy = function (dxPx, dyPx) {
    this.cx -= dxPx / this.scale;
    this.cy -= dyPx / this.scale;
    this.apply();
  };

  // ---------------------------------------------------------------- search
  View.prototype.find = function (text) {
    var q = text.trim().toLowerCase();
    this.nodes.forEach(function (n) { n.g.classList.remove("match", "found"); });
    this.at = -1;
    if (!q) {
      this.matches = [];
      this.status.textContent = "";
      return;
    }
    var inLabel = this.nodes.filter(function (n) { return n.label.indexOf(q) >= 0; });
    var inTip = this.nodes.filter(function (n) {
      return n.label.indexOf(q) < 0 && n.tip.indexOf(q) >= 0;
    });
    this.matches = inLabel.concat(inTip);
    this.matches.forEach(function (n) { n.g.classList.add("match"); });
    this.status.textContent = this.matches.length ?
      this.matches.length + " match" + (this.matches.length > 1 ? "es" : "") + " (Enter)" :
      "no match";
  };

  View.prototype.next = function (direction) {
    if (!this.matches.length) { return; }
    if (this.at >= 0) { this.matches[this.at].g.classList.remove("found"); }
    var n = this.matches.length;
    this.at = ((this.at + direction) % n + n) % n;
    var node = this.matches[this.at];
    node.g.classList.add("found");
    this.box.scrollIntoView({block: "nearest"});
    this.scale = Math.max(this.scale, this.clamp(READABLE));
    this.apply();
    var p = this.userPoint(this.centreOf(node.g));
    this.cx = p.x;
    this.cy = p.y;
    this.apply();
    this.status.textContent = (this.at + 1) + " of " + n + ": " + node.name;
  };

  // ---------------------------------------------------------------- input
  View.prototype.listen = function () {
    var self = this, box = this.box, drag = null, dragged = false;
    box.addEventListener("mouseenter", function () { current = self; });
    box.addEventListener("focus", function () { current = self; });
    box.addEventListener("wheel", function (e) {
      e.preventDefault();
      current = self;
      var dy = e.deltaMode === 1 ? e.deltaY * 16 : e.deltaY;
      self.zoomBy(Math.exp(-Math.max(-200, Math.min(200, dy)) * 0.002),
                  {x: e.clientX, y: e.clientY});
    }, {passive: false});
    box.addEventListener("mousedown", function (e) {
      if (e.button !== 0) { return; }
      current = self;
      drag = {x: e.clientX, y: e.clientY};
      dragged = false;
      box.focus({preventScroll: true});
      e.preventDefault();
    });
    window.addEventListener("mousemove", function (e) {
      if (!drag) { return; }
      var dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (!dragged && Math.abs(dx) + Math.abs(dy) < DRAG_PX) { return; }
      dragged = true;
      box.classList.add("dragging");
      drag = {x: e.clientX, y: e.clientY};
      self.panBy(dx, dy);
    });
    window.addEventListener("mouseup", function () {
      drag = null;
      box.classList.remove("dragging");
    });
    // a drag that ends over a node must not follow its link
    box.addEventListener("click", function (e) {
      if (dragged) { e.preventDefault(); e.stopPropagation(); dragged = false; }
    }, true);
    box.addEventListener("dragstart", function (e) { e.preventDefault(); });
  };

  function onKey(e) {
    var view = current || views[0];
    var target = e.target;
    if (!view || e.ctrlKey || e.metaKey || e.altKey ||
        (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA"))) {
      return;
    }
    var dx = PAN_STEP * view.w, dy = PAN_STEP * view.h;
    var actions = {
      "+": function () { view.zoomBy(ZOOM_STEP); },
      "=": function () { view.zoomBy(ZOOM_STEP); },
      "-": function () { view.zoomBy(1 / ZOOM_STEP); },
      "_": function () { view.zoomBy(1 / ZOOM_STEP); },
      "0": function () { view.fit(); },
      "1": function () { view.readable(); },
      "ArrowLeft": function () { view.panBy(dx, 0); },
      "ArrowRight": function () { view.panBy(-dx, 0); },
      "ArrowUp": function () { view.panBy(0, dy); },
      "ArrowDown": function () { view.panBy(0, -dy); },
      "/": function () { if (view.search) { view.search.focus(); } }
    };
    if (actions[e.key]) {
      e.preventDefault();
      actions[e.key]();
    }
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("div.svgview"), function (box) {
      if (box.querySelector("svg")) { views.push(new View(box)); }
    });
    if (!views.length) { return; }
    document.addEventListener("keydown", onKey);
    window.addEventListener("resize", function () {
      views.forEach(function (v) { v.size(false); });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
}());
