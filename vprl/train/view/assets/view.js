// The run viewer: renders window.VIEW_DATA (data.js, written by `python -m vprl.train.view`).
// Plain DOM, no framework, nothing fetched: the page opens from disk.
//
// Every value reaches the page through `el` / `svg` only: they make elements, set attributes with
// setAttribute and put text in text nodes. No markup is ever parsed from a string (no innerHTML),
// so whatever a row holds (`<img onerror=...>`, a closing script tag, quotes) is shown as the text it is.
// (This file is inlined in a script element: it must itself hold no closing script tag.)
(function () {
  "use strict";
  var D = window.VIEW_DATA;
  var COLORS = ["#e6194b", "#3c7dd9", "#f58231", "#911eb4", "#0a9396", "#c9a400", "#f032e6", "#6b8e23"];
  var PER_PAGE = { programs: 24, groups: 6, compare: 12, tests: 10 };
  var SVG_NS = "http://www.w3.org/2000/svg";
  // The only pictures a page shows are the ones the viewer wrote beside it.
  var PICTURE_SRC = /^images\/[0-9a-f]+\.jpg$/;
  var state = { view: D.kind === "evaluation" ? "compare" : "programs", page: 0 };
  var F = {}; // the filters' current values, by name

  function $(id) { return document.getElementById(id); }

  function build(ns, tag, attrs, kids) {
    var node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      var value = attrs[name];
      if (value == null || value === false) return;
      if (/^on/i.test(name)) throw new Error("the viewer sets no event-handler attribute: " + name);
      if ((name === "src" || name === "href") && !PICTURE_SRC.test(String(value))) return;
      node.setAttribute(name, String(value));
    });
    add(node, kids);
    return node;
  }
  function add(node, kids) {
    kids.forEach(function (k) {
      if (k == null || k === false || k === "") return;
      if (Array.isArray(k)) add(node, k);
      else node.appendChild(k instanceof Node ? k : document.createTextNode(String(k)));
    });
  }
  function el(tag, attrs) { return build(null, tag, attrs, Array.prototype.slice.call(arguments, 2)); }
  function svg(tag, attrs) { return build(SVG_NS, tag, attrs, Array.prototype.slice.call(arguments, 2)); }
  function fill(node, kids) {
    while (node.firstChild) node.removeChild(node.firstChild);
    add(node, kids);
  }
  function text(x) { return x == null ? "" : typeof x === "string" ? x : JSON.stringify(x); }
  function fmt(x, digits) {
    return x == null || isNaN(Number(x)) ? "–" : Number(x).toFixed(digits == null ? 2 : digits);
  }
  function color(i) { return COLORS[((Number(i) - 1) % COLORS.length + COLORS.length) % COLORS.length] || COLORS[0]; }
  function list(x) { return Array.isArray(x) ? x : []; }

  // ---- header: what is shown, the curves -------------------------------------------------------
  function header() {
    $("title").textContent = text(D.title);
    $("shown").textContent = text(D.shown);
    $("notes").textContent = list(D.notes).map(text).join(" · ");
    var c = D.curves;
    if (!c || !c.step || !c.step.length) { $("curves").style.display = "none"; return; }
    fill($("curves"), [chart("mean reward", c.step, c.reward), chart("accuracy", c.step, c.accuracy),
      chart("exception rate", c.step, c.exceptions), chart("rollouts per step", c.step, c.n)]);
  }

  function chart(name, xs, ys) {
    var W = 260, H = 90, L = 34, B = 14;
    var pts = [];
    xs.forEach(function (x, i) { if (ys[i] != null) pts.push([x, ys[i]]); });
    if (!pts.length) return null;
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var vals = pts.map(function (p) { return p[1]; });
    var y0 = Math.min.apply(null, vals), y1 = Math.max.apply(null, vals);
    if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
    function px(x) { return L + (x1 === x0 ? (W - L) / 2 : (x - x0) / (x1 - x0) * (W - L - 4)); }
    function py(y) { return 4 + (1 - (y - y0) / (y1 - y0)) * (H - B - 8); }
    var line = pts.map(function (p) { return px(p[0]).toFixed(1) + "," + py(p[1]).toFixed(1); }).join(" ");
    return el("div", { class: "chart", "data-curve": name }, el("h3", {}, name + " (last " + fmt(vals[vals.length - 1]) + ")"),
      svg("svg", { width: W, height: H },
        svg("text", { class: "axis", x: 0, y: 10 }, fmt(y1)),
        svg("text", { class: "axis", x: 0, y: H - B }, fmt(y0)),
        svg("text", { class: "axis", x: L, y: H - 2 }, "step " + x0),
        svg("text", { class: "axis", x: W - 50, y: H - 2 }, String(x1)),
        pts.length > 1 ? svg("polyline", { class: "line", points: line })
          : svg("circle", { r: 3, cx: px(pts[0][0]), cy: py(pts[0][1]) })));
  }

  // ---- filters ---------------------------------------------------------------------------------
  function select(id, key, choices) {
    return el("select", { id: id, "data-f": key }, choices.map(function (o) { return el("option", { value: o[0] }, o[1]); }));
  }
  function distinct(key) {
    var seen = {};
    D.cards.forEach(function (c) { if (c[key] != null) seen[text(c[key])] = 1; });
    return [["", "all"]].concat(Object.keys(seen).sort().map(function (v) { return [v, v === "" ? "(none)" : v]; }));
  }
  function number(id, key, any) { return el("input", { type: "number", step: any ? "any" : null, id: id, "data-f": key }); }

  function filterBar() {
    var run = D.kind === "run";
    var tabs = [["programs", "Programs"]];
    if (run) tabs.push(["groups", "Groups"]);
    if (!run) tabs.push(["compare", "Before / after"]);
    if (D.cards.some(function (c) { return list(c.ut).length; })) tabs.push(["tests", "Unit tests"]);
    var bar = [el("span", { class: "tabs" }, tabs.map(function (t, i) {
      return [i ? " " : "", el("button", { "data-view": t[0] }, t[1])];
    }))];
    if (run) bar.push(el("label", {}, "step ", number("f-smin", "smin"), " to ", number("f-smax", "smax")));
    bar.push(el("label", {}, "family ", select("f-fam", "fam", distinct("fam"))));
    bar.push(el("label", {}, "task ", select("f-task", "task", distinct("task"))));
    bar.push(el("label", {}, "dataset ", select("f-ds", "ds", distinct("ds"))));
    bar.push(el("label", {}, "status ", select("f-st", "st", distinct("st"))));
    bar.push(el("label", {}, "answer ", select("f-right", "right",
      [["", "all"], ["right", "right"], ["wrong", "wrong"], ["unknown", "no gold"]])));
    if (run) {
      bar.push(el("label", {}, "reward ", number("f-rmin", "rmin", true), " to ", number("f-rmax", "rmax", true)));
    } else {
      bar.push(el("label", {}, "change ", select("f-kind", "kind", [["", "all"], ["broken", "right before, wrong after"],
        ["fixed", "wrong before, right after"], ["both_right", "right both times"], ["both_wrong", "wrong both times"]])));
      bar.push(el("label", {}, "policy ", select("f-pol", "pol", distinct("pol"))));
    }
    bar.push(el("label", {}, "text ", el("input", { type: "search", id: "f-text", "data-f": "text", placeholder: "question or program" })));
    bar.push(el("span", { id: "count" }), el("span", { id: "pager" }, el("button", { id: "prev" }, "‹"), " ",
      el("span", { id: "pageno" }), " ", el("button", { id: "next" }, "›")));
    fill($("bar"), bar);
    Array.prototype.forEach.call($("bar").querySelectorAll("[data-f]"), function (node) {
      node.addEventListener(node.tagName === "SELECT" ? "change" : "input", function () {
        F[node.getAttribute("data-f")] = node.value;
        state.page = 0;
        render();
      });
    });
    Array.prototype.forEach.call($("bar").querySelectorAll("[data-view]"), function (node) {
      node.addEventListener("click", function () { state.view = node.getAttribute("data-view"); state.page = 0; render(); });
    });
    $("prev").addEventListener("click", function () { if (state.page > 0) { state.page--; render(); } });
    $("next").addEventListener("click", function () { state.page++; render(); });
  }

  function passes(c) {
    if (F.smin && c.s != null && c.s < +F.smin) return false;
    if (F.smax && c.s != null && c.s > +F.smax) return false;
    if (F.fam && text(c.fam) !== F.fam) return false;
    if (F.task && text(c.task) !== F.task) return false;
    if (F.ds && text(c.ds) !== F.ds) return false;
    if (F.st && text(c.st) !== F.st) return false;
    if (F.pol && text(c.pol) !== F.pol) return false;
    if (F.right === "right" && c.right !== true) return false;
    if (F.right === "wrong" && c.right !== false) return false;
    if (F.right === "unknown" && c.right != null) return false;
    if (F.rmin && !(c.tot != null && c.tot >= +F.rmin)) return false;
    if (F.rmax && !(c.tot != null && c.tot <= +F.rmax)) return false;
    if (F.text) {
      var t = F.text.toLowerCase();
      if (text(c.q).toLowerCase().indexOf(t) < 0 && text(c.prog).toLowerCase().indexOf(t) < 0 &&
        text(c.e).toLowerCase().indexOf(t) < 0) return false;
    }
    return true;
  }

  // ---- one card --------------------------------------------------------------------------------
  // A missing picture's placeholder says why (a refused path names the path and the reason).
  function noPicture(why) {
    return el("div", { class: "nopic", "data-why": why || null }, "no picture (" + (why || "the image could not be read") + ")");
  }

  function picture(c) {
    var img = c.img == null ? null : D.images[c.img];
    if (!img) return el("div", { class: "frame" }, noPicture(c.noimg));
    var W = img.w, H = img.h, fs = Math.max(W, H) / 22;
    var shapes = [];
    // A label sits above its box; a looked-at region's label (with the tool's answer) below it, so
    // that it does not cover the label of the detection the region usually is.
    function rect(b, cls, col, call, label, below) {
      var x = Math.min(b[0], b[2]), y = Math.min(b[1], b[3]), w = Math.abs(b[2] - b[0]), h = Math.abs(b[3] - b[1]);
      var ty = below ? Math.min(H - 2, y + h + fs) : Math.max(fs, y - 2);
      shapes.push(svg("g", { "data-call": call },
        svg("rect", { class: "box " + cls, x: x, y: y, width: w, height: h, stroke: col, "vector-effect": "non-scaling-stroke" }),
        label ? svg("text", { x: x + 2, y: ty, "font-size": fs.toFixed(1), fill: col }, label) : null));
    }
    list(c.calls).forEach(function (m) {
      var col = color(m.i), res = text(m.res);
      var said = res.length > 24 ? res.slice(0, 22) + "…" : res;
      if (m.region) rect(m.region, "region", col, m.i, m.tool === "detect" ? "" : "#" + m.i + " → " + said, true);
      list(m.boxes).forEach(function (b) {
        rect(b, "det", col, m.i, "#" + m.i + " " + text(b[5]) + (b[4] != null ? " " + fmt(b[4]) : ""));
      });
    });
    if (c.gbox) rect(c.gbox, "gold", "#11a84a", "gold", "gold", true);
    if (c.abox) rect(c.abox, "answer", "#d0119f", "answer", "answer");
    return el("div", { class: "frame" }, el("img", { loading: "lazy", src: img.src, alt: "" }),
      svg("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none" }, shapes));
  }

  function callList(c) {
    var calls = list(c.calls);
    if (!calls.length) {
      return el("ul", { class: "calls" }, el("li", { style: "border-color:#ccc" }, c.nt ? "tool calls not recorded" : "no tool calls"));
    }
    return el("ul", { class: "calls" }, calls.map(function (m) {
      var n = list(m.boxes).length;
      var res = m.tool === "detect" ? n + (m.cut ? "+ boxes (trace cut)" : " box" + (n === 1 ? "" : "es"))
        : text(m.res) + (m.cut ? " (trace cut)" : "");
      return el("li", { "data-call": m.i, style: "border-color:" + color(m.i) }, "#" + m.i + " " + text(m.label),
        m.line == null ? null : [" ", el("span", { class: "line" }, "line " + m.line + (m.inf ? " (matched)" : ""))],
        " → ", el("span", { class: "res" }, res));
    }));
  }

  function program(c) {
    var tags = {};
    list(c.calls).forEach(function (m) { if (m.line != null) (tags[m.line] = tags[m.line] || []).push(m); });
    var lines = text(c.prog).replace(/\n$/, "").split("\n");
    return el("pre", { class: "prog" }, lines.map(function (line, k) {
      var n = k + 1, t = tags[n] || [];
      // Each call made from this line, labelled as in the call list (a loop's calls each get a tag).
      return el("div", { class: t.length ? "hit" : "", "data-line": n }, el("span", { class: "ln" }, n), line,
        t.map(function (m) {
          return el("span", { class: "tag", "data-call": m.i, title: text(m.label) + (m.inf ? " (line matched)" : ""),
            style: "background:" + color(m.i) }, "#" + m.i);
        }));
    }));
  }

  function verdict(c) {
    if (c.right === true) return [" ", el("span", { class: "right" }, "✓ right")];
    if (c.right === false) return [" ", el("span", { class: "wrong" }, "✗ wrong")];
    return null;
  }

  function components(c) {
    var comp = c.comp && typeof c.comp === "object" ? c.comp : {};
    var names = Object.keys(comp);
    if (!names.length) return null;
    return el("table", { class: "comp" },
      el("tr", {}, names.map(function (k) { return el("td", {}, k); })),
      el("tr", {}, names.map(function (k) { return el("td", {}, fmt(comp[k], 3)); })));
  }

  // A repair episode: the earlier turns side by side with the final program, each with its feedback.
  function episode(c, turns) {
    return el("div", { class: "turns" }, turns.map(function (t, k) {
      return el("div", { class: "turn", "data-turn": k + 1 },
        el("div", { class: "thead" }, "turn " + (k + 1) + " ", el("span", { class: "status " + text(t.st) }, text(t.st)),
          " answer ", el("b", {}, t.ans == null ? "(none)" : text(t.ans))),
        program(t), t.err ? el("div", { class: "err" }, text(t.err)) : null, callList(t),
        t.feedback != null ? el("pre", { class: "feedback" }, text(t.feedback)) : null);
    }), el("div", { class: "turn final", "data-turn": turns.length + 1 },
      el("div", { class: "thead" }, "turn " + (turns.length + 1) + " (final)"), program(c)));
  }

  function card(idx, compact) {
    var c = D.cards[idx];
    var head = [];
    if (c.s != null && !compact) head.push("step " + text(c.s));
    if (c.pol && !compact) head.push(text(c.pol));
    if (c.mode) head.push(text(c.mode) + " seed " + text(c.seed));
    if (!compact) head.push(text(c.ds) + (c.fam ? " / " + text(c.fam) : ""));
    head.push(el("span", { class: "status " + text(c.st) }, text(c.st)));
    if (c.tot !== undefined && D.kind === "run") head.push(["reward ", el("b", {}, fmt(c.tot))]);
    if (c.adv != null) head.push("advantage " + (c.adv > 0 ? "+" : "") + fmt(c.adv));
    var parts = head.map(function (p, i) { return [i ? " · " : "", p]; });
    if (!compact) parts.push(" ", el("span", { title: "example id" }, text(c.e)));
    var tests = list(c.ut);
    var turns = compact ? [] : list(c.turns);
    return el("div", { class: "card" + (compact ? " compact" : "") + (turns.length ? " episode" : ""), "data-card": idx,
      "data-status": text(c.st) },
      el("div", { class: "head" }, parts),
      compact ? null : el("div", { class: "q" }, text(c.q)),
      compact ? [picture(c), callList(c)] : el("div", { class: "body" }, picture(c), callList(c)),
      turns.length ? episode(c, turns) : program(c),
      el("div", { class: "answer" }, "answer ", el("b", {}, c.ans == null ? "(none)" : text(c.ans)),
        c.gold != null ? [" · gold ", el("b", {}, text(c.gold))] : null, verdict(c),
        c.fb ? " · fallback " + text(c.fb) : null),
      c.err ? el("div", { class: "err" }, text(c.err)) : null,
      components(c),
      tests.length ? el("div", { class: "answer" }, "unit tests: ", tests.map(function (t, i) {
        var ok = t.sc != null && t.sc >= 0.5;
        return [i ? " " : "", el("span", { class: ok ? "pass" : "fail" }, ok ? "✓" : "✗")];
      })) : null);
  }

  // ---- views -----------------------------------------------------------------------------------
  function pageOf(items, per) {
    var pages = Math.max(1, Math.ceil(items.length / per));
    if (state.page >= pages) state.page = pages - 1;
    $("pageno").textContent = "page " + (state.page + 1) + " of " + pages;
    return items.slice(state.page * per, (state.page + 1) * per);
  }

  function viewPrograms() {
    var idx = [];
    D.cards.forEach(function (c, i) { if (passes(c)) idx.push(i); });
    setCount(idx.length, "program" + (idx.length === 1 ? "" : "s") + " match");
    return el("div", { class: "grid" }, pageOf(idx, PER_PAGE.programs).map(function (i) { return card(i, false); }));
  }

  function viewGroups() {
    var gs = D.groups.filter(function (g) { return g.cards.some(function (i) { return passes(D.cards[i]); }); });
    setCount(gs.length, "group" + (gs.length === 1 ? "" : "s") + " match");
    return pageOf(gs, PER_PAGE.groups).map(function (g) {
      var members = g.cards.slice().sort(function (a, b) {
        var ta = D.cards[a].tot, tb = D.cards[b].tot;
        return (tb == null ? -1e9 : tb) - (ta == null ? -1e9 : ta);
      });
      var first = D.cards[members[0]];
      var rewards = members.map(function (i) { return fmt(D.cards[i].tot); }).join(", ");
      return el("div", { class: "group", "data-group": D.groups.indexOf(g) },
        el("div", { class: "ghead" }, "step " + text(g.s) + " · " + text(first.q) +
          (first.gold != null ? " · gold " + text(first.gold) : "") + " · rewards " + rewards),
        el("div", { class: "row" }, members.map(function (i) { return card(i, true); })));
    });
  }

  function viewCompare() {
    var ps = D.pairs.filter(function (p) {
      if (F.kind && p.k !== F.kind) return false;
      return [p.a, p.b].some(function (i) { return i != null && passes(D.cards[i]); });
    });
    setCount(ps.length, "question" + (ps.length === 1 ? "" : "s") + " match");
    var names = { fixed: "fixed", broken: "broken", both_right: "right both", both_wrong: "wrong both", unknown: "no gold" };
    return pageOf(ps, PER_PAGE.compare).map(function (p) {
      return el("div", { class: "pair", "data-kind": p.k }, el("div", { class: "kind " + p.k }, names[p.k]),
        p.a != null ? card(p.a, false) : el("div", { class: "card" }, "no answer from " + text(D.policies[0])),
        p.b != null ? card(p.b, false) : el("div", { class: "card" }, "no answer from " + text(D.policies[1])));
    });
  }

  function viewTests() {
    var byQuery = {}, order = [];
    D.cards.forEach(function (c, i) {
      if (!list(c.ut).length || !passes(c)) return;
      var q = text(c.q);
      if (!Object.prototype.hasOwnProperty.call(byQuery, q)) { byQuery[q] = []; order.push(q); }
      byQuery[q].push(i);
    });
    setCount(order.length, "question" + (order.length === 1 ? "" : "s") + " with unit tests match");
    return pageOf(order, PER_PAGE.tests).map(function (q) {
      var ids = byQuery[q], tests = D.cards[ids[0]].ut;
      var head = el("tr", {}, el("th", {}, q), tests.map(function (t) {
        var img = t.img == null ? null : D.images[t.img];
        return el("th", {}, img ? el("img", { src: img.src, alt: "" }) : noPicture(t.noimg), text(t.cap),
          el("br", {}), "expects ", el("b", {}, text(t.exp)));
      }));
      var rows = ids.map(function (i) {
        var c = D.cards[i];
        return el("tr", { "data-card": i },
          el("td", {}, "step " + text(c.s) + " · " + text(c.st) + " · unit_tests " + fmt((c.comp || {}).unit_tests)),
          list(c.ut).map(function (t) {
            var ok = t.sc != null && t.sc >= 0.5;
            return el("td", {}, el("span", { class: ok ? "pass" : "fail" }, ok ? "pass" : "fail"), " ",
              text(t.ans == null ? t.st : t.ans));
          }));
      });
      return el("table", { class: "ut" }, head, rows);
    });
  }

  function setCount(n, what) {
    $("count").textContent = n + " " + what;
    $("count").setAttribute("data-count", n);
  }

  function render() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-view]"), function (b) {
      b.className = b.getAttribute("data-view") === state.view ? "on" : "";
    });
    var views = { programs: viewPrograms, groups: viewGroups, compare: viewCompare, tests: viewTests };
    fill($("main"), [views[state.view]()]);
    $("main").setAttribute("data-view", state.view);
  }

  // Hovering a call (in the list or on the picture) dims every other call's boxes.
  document.addEventListener("mouseover", function (ev) {
    var li = ev.target.closest && ev.target.closest("[data-call]");
    var cardEl = ev.target.closest && ev.target.closest(".card");
    if (!cardEl) return;
    var call = li ? li.getAttribute("data-call") : null;
    Array.prototype.forEach.call(cardEl.querySelectorAll("svg g[data-call]"), function (g) {
      g.classList.toggle("dim", call != null && g.getAttribute("data-call") !== call);
    });
  });

  header();
  filterBar();
  render();
})();
