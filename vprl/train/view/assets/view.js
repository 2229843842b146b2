// The run viewer: renders window.VIEW_DATA (data.js, written by `python -m vprl.train.view`).
// Plain DOM, no framework, nothing fetched: the page opens from disk.
(function () {
  "use strict";
  var D = window.VIEW_DATA;
  var COLORS = ["#e6194b", "#3c7dd9", "#f58231", "#911eb4", "#0a9396", "#c9a400", "#f032e6", "#6b8e23"];
  var PER_PAGE = { programs: 24, groups: 6, compare: 12, tests: 10 };
  var state = { view: D.kind === "evaluation" ? "compare" : "programs", page: 0 };
  var F = {}; // the filters' current values, by name

  function $(id) { return document.getElementById(id); }
  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (ch) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[ch];
    });
  }
  function fmt(x, digits) { return x == null ? "–" : Number(x).toFixed(digits == null ? 2 : digits); }
  function color(i) { return COLORS[(i - 1) % COLORS.length]; }

  // ---- header: what is shown, the curves -------------------------------------------------------
  function header() {
    $("title").textContent = D.title;
    $("shown").textContent = D.shown;
    $("notes").textContent = (D.notes || []).join(" · ");
    var c = D.curves;
    if (!c || !c.step || !c.step.length) { $("curves").style.display = "none"; return; }
    $("curves").innerHTML = chart("mean reward", c.step, c.reward) + chart("accuracy", c.step, c.accuracy) +
      chart("exception rate", c.step, c.exceptions) + chart("rollouts per step", c.step, c.n);
  }

  function chart(name, xs, ys) {
    var W = 260, H = 90, L = 34, B = 14;
    var pts = [];
    xs.forEach(function (x, i) { if (ys[i] != null) pts.push([x, ys[i]]); });
    if (!pts.length) return "";
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var vals = pts.map(function (p) { return p[1]; });
    var y0 = Math.min.apply(null, vals), y1 = Math.max.apply(null, vals);
    if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
    function px(x) { return L + (x1 === x0 ? (W - L) / 2 : (x - x0) / (x1 - x0) * (W - L - 4)); }
    function py(y) { return 4 + (1 - (y - y0) / (y1 - y0)) * (H - B - 8); }
    var line = pts.map(function (p) { return px(p[0]).toFixed(1) + "," + py(p[1]).toFixed(1); }).join(" ");
    return '<div class="chart" data-curve="' + esc(name) + '"><h3>' + esc(name) + " (last " + fmt(vals[vals.length - 1]) +
      ')</h3><svg width="' + W + '" height="' + H + '">' +
      '<text class="axis" x="0" y="10">' + fmt(y1) + '</text><text class="axis" x="0" y="' + (H - B) + '">' + fmt(y0) +
      '</text><text class="axis" x="' + L + '" y="' + (H - 2) + '">step ' + x0 + '</text><text class="axis" x="' + (W - 50) +
      '" y="' + (H - 2) + '">' + x1 + "</text>" + (pts.length > 1 ? '<polyline class="line" points="' + line + '"/>'
        : '<circle r="3" cx="' + px(pts[0][0]) + '" cy="' + py(pts[0][1]) + '"/>') + "</svg></div>";
  }

  // ---- filters ---------------------------------------------------------------------------------
  function options(values) {
    return ['<option value="">all</option>'].concat(values.map(function (v) {
      return '<option value="' + esc(v) + '">' + esc(v === "" ? "(none)" : v) + "</option>";
    })).join("");
  }
  function distinct(key) {
    var seen = {};
    D.cards.forEach(function (c) { if (c[key] != null) seen[c[key]] = 1; });
    return Object.keys(seen).sort();
  }

  function filterBar() {
    var run = D.kind === "run";
    var tabs = [["programs", "Programs"]];
    if (run) tabs.push(["groups", "Groups"]);
    if (!run) tabs.push(["compare", "Before / after"]);
    if (D.cards.some(function (c) { return c.ut && c.ut.length; })) tabs.push(["tests", "Unit tests"]);
    var html = '<span class="tabs">' + tabs.map(function (t) {
      return '<button data-view="' + t[0] + '">' + t[1] + "</button>";
    }).join(" ") + "</span>";
    if (run) {
      html += '<label>step <input type="number" id="f-smin" data-f="smin"> to <input type="number" id="f-smax" data-f="smax"></label>';
    }
    html += '<label>family <select id="f-fam" data-f="fam">' + options(distinct("fam")) + "</select></label>";
    html += '<label>task <select id="f-task" data-f="task">' + options(distinct("task")) + "</select></label>";
    html += '<label>dataset <select id="f-ds" data-f="ds">' + options(distinct("ds")) + "</select></label>";
    html += '<label>status <select id="f-st" data-f="st">' + options(distinct("st")) + "</select></label>";
    html += '<label>answer <select id="f-right" data-f="right"><option value="">all</option><option value="right">right</option>' +
      '<option value="wrong">wrong</option><option value="unknown">no gold</option></select></label>';
    if (run) {
      html += '<label>reward <input type="number" step="any" id="f-rmin" data-f="rmin"> to <input type="number" step="any" id="f-rmax" data-f="rmax"></label>';
    } else {
      html += '<label>change <select id="f-kind" data-f="kind"><option value="">all</option>' +
        '<option value="broken">right before, wrong after</option><option value="fixed">wrong before, right after</option>' +
        '<option value="both_right">right both times</option><option value="both_wrong">wrong both times</option></select></label>';
      html += '<label>policy <select id="f-pol" data-f="pol">' + options(distinct("pol")) + "</select></label>";
    }
    html += '<label>text <input type="search" id="f-text" data-f="text" placeholder="question or program"></label>';
    html += '<span id="count"></span><span id="pager"><button id="prev">‹</button> <span id="pageno"></span> <button id="next">›</button></span>';
    $("bar").innerHTML = html;
    Array.prototype.forEach.call($("bar").querySelectorAll("[data-f]"), function (el) {
      el.addEventListener(el.tagName === "SELECT" ? "change" : "input", function () {
        F[el.getAttribute("data-f")] = el.value;
        state.page = 0;
        render();
      });
    });
    Array.prototype.forEach.call($("bar").querySelectorAll("[data-view]"), function (el) {
      el.addEventListener("click", function () { state.view = el.getAttribute("data-view"); state.page = 0; render(); });
    });
    $("prev").addEventListener("click", function () { if (state.page > 0) { state.page--; render(); } });
    $("next").addEventListener("click", function () { state.page++; render(); });
  }

  function passes(c) {
    if (F.smin && c.s != null && c.s < +F.smin) return false;
    if (F.smax && c.s != null && c.s > +F.smax) return false;
    if (F.fam && c.fam !== F.fam) return false;
    if (F.task && c.task !== F.task) return false;
    if (F.ds && c.ds !== F.ds) return false;
    if (F.st && c.st !== F.st) return false;
    if (F.pol && c.pol !== F.pol) return false;
    if (F.right === "right" && c.right !== true) return false;
    if (F.right === "wrong" && c.right !== false) return false;
    if (F.right === "unknown" && c.right != null) return false;
    if (F.rmin && !(c.tot != null && c.tot >= +F.rmin)) return false;
    if (F.rmax && !(c.tot != null && c.tot <= +F.rmax)) return false;
    if (F.text) {
      var t = F.text.toLowerCase();
      if ((c.q || "").toLowerCase().indexOf(t) < 0 && (c.prog || "").toLowerCase().indexOf(t) < 0 &&
        (c.e || "").toLowerCase().indexOf(t) < 0) return false;
    }
    return true;
  }

  // ---- one card --------------------------------------------------------------------------------
  function picture(c) {
    var img = c.img == null ? null : D.images[c.img];
    if (!img) return '<div class="frame"><div class="nopic">no picture (the image could not be read)</div></div>';
    var W = img.w, H = img.h, fs = Math.max(W, H) / 22;
    var shapes = [];
    // A label sits above its box; a looked-at region's label (with the tool's answer) below it, so
    // that it does not cover the label of the detection the region usually is.
    function rect(b, cls, col, call, label, below) {
      var x = Math.min(b[0], b[2]), y = Math.min(b[1], b[3]), w = Math.abs(b[2] - b[0]), h = Math.abs(b[3] - b[1]);
      var ty = below ? Math.min(H - 2, y + h + fs) : Math.max(fs, y - 2);
      shapes.push('<g data-call="' + call + '"><rect class="box ' + cls + '" x="' + x + '" y="' + y + '" width="' + w +
        '" height="' + h + '" stroke="' + col + '" vector-effect="non-scaling-stroke"/>' + (label ? '<text x="' + (x + 2) +
        '" y="' + ty + '" font-size="' + fs.toFixed(1) + '" fill="' + col + '">' + esc(label) + "</text>" : "") + "</g>");
    }
    c.calls.forEach(function (m) {
      var col = color(m.i);
      var said = m.res.length > 24 ? m.res.slice(0, 22) + "…" : m.res;
      if (m.region) rect(m.region, "region", col, m.i, m.tool === "detect" ? "" : "#" + m.i + " → " + said, true);
      m.boxes.forEach(function (b) { rect(b, "det", col, m.i, "#" + m.i + " " + (b[5] || "") + (b[4] != null ? " " + fmt(b[4]) : "")); });
    });
    if (c.gbox) rect(c.gbox, "gold", "#11a84a", "gold", "gold", true);
    if (c.abox) rect(c.abox, "answer", "#d0119f", "answer", "answer");
    return '<div class="frame"><img loading="lazy" src="' + esc(img.src) + '" alt="">' + '<svg viewBox="0 0 ' + W + " " + H +
      '" preserveAspectRatio="none">' + shapes.join("") + "</svg></div>";
  }

  function callList(c) {
    if (!c.calls.length) {
      return '<ul class="calls"><li style="border-color:#ccc">' + (c.nt ? "tool calls not recorded" : "no tool calls") + "</li></ul>";
    }
    return '<ul class="calls">' + c.calls.map(function (m) {
      var res = m.tool === "detect" ? m.boxes.length + (m.cut ? "+ boxes (trace cut)" : " box" + (m.boxes.length === 1 ? "" : "es"))
        : m.res + (m.cut ? " (trace cut)" : "");
      var line = m.line == null ? "" : ' <span class="line">line ' + m.line + (m.inf ? " (matched)" : "") + "</span>";
      return '<li data-call="' + m.i + '" style="border-color:' + color(m.i) + '">#' + m.i + " " + esc(m.label) + line +
        ' → <span class="res">' + esc(res) + "</span></li>";
    }).join("") + "</ul>";
  }

  function program(c) {
    var tags = {};
    c.calls.forEach(function (m) { if (m.line != null) (tags[m.line] = tags[m.line] || []).push(m); });
    var lines = (c.prog || "").replace(/\n$/, "").split("\n");
    return '<pre class="prog">' + lines.map(function (text, k) {
      var n = k + 1, t = tags[n] || [];
      // Each call made from this line, labelled as in the call list (a loop's calls each get a tag).
      var marks = t.map(function (m) {
        return '<span class="tag" data-call="' + m.i + '" title="' + esc(m.label + (m.inf ? " (line matched)" : "")) +
          '" style="background:' + color(m.i) + '">#' + m.i + "</span>";
      }).join("");
      return '<div class="' + (t.length ? "hit" : "") + '" data-line="' + n + '"><span class="ln">' + n + "</span>" + esc(text) + marks + "</div>";
    }).join("") + "</pre>";
  }

  function verdict(c) {
    if (c.right === true) return ' <span class="right">✓ right</span>';
    if (c.right === false) return ' <span class="wrong">✗ wrong</span>';
    return "";
  }

  function card(idx, compact) {
    var c = D.cards[idx];
    var head = [];
    if (c.s != null && !compact) head.push("step " + c.s);
    if (c.pol && !compact) head.push(esc(c.pol));
    if (c.mode) head.push(esc(c.mode) + " seed " + c.seed);
    if (!compact) head.push(esc(c.ds) + (c.fam ? " / " + esc(c.fam) : ""));
    head.push('<span class="status ' + esc(c.st) + '">' + esc(c.st) + "</span>");
    if (c.tot !== undefined && D.kind === "run") head.push("reward <b>" + fmt(c.tot) + "</b>");
    if (c.adv != null) head.push("advantage " + (c.adv > 0 ? "+" : "") + fmt(c.adv));
    var comps = Object.keys(c.comp || {});
    var html = '<div class="card' + (compact ? " compact" : "") + '" data-card="' + idx + '" data-status="' + esc(c.st) + '">' +
      '<div class="head">' + head.join(" · ") + (compact ? "" : ' <span title="example id">' + esc(c.e) + "</span>") +
      "</div>" + (compact ? "" : '<div class="q">' + esc(c.q) + "</div>") +
      (compact ? picture(c) + callList(c) : '<div class="body">' + picture(c) + callList(c) + "</div>") +
      program(c) +
      '<div class="answer">answer <b>' + esc(c.ans == null ? "(none)" : c.ans) + "</b>" +
      (c.gold != null ? " · gold <b>" + esc(c.gold) + "</b>" : "") + verdict(c) +
      (c.fb ? " · fallback " + esc(c.fb) : "") + "</div>" +
      (c.err ? '<div class="err">' + esc(c.err) + "</div>" : "") +
      (comps.length ? '<table class="comp"><tr>' + comps.map(function (k) { return "<td>" + esc(k) + "</td>"; }).join("") +
        "</tr><tr>" + comps.map(function (k) { return "<td>" + fmt(c.comp[k], 3) + "</td>"; }).join("") + "</tr></table>" : "") +
      (c.ut && c.ut.length ? '<div class="answer">unit tests: ' + c.ut.map(function (t) {
        return t.sc != null && t.sc >= 0.5 ? '<span class="pass">✓</span>' : '<span class="fail">✗</span>';
      }).join(" ") + "</div>" : "") +
      "</div>";
    return html;
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
    return '<div class="grid">' + pageOf(idx, PER_PAGE.programs).map(function (i) { return card(i, false); }).join("") + "</div>";
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
      return '<div class="group" data-group="' + D.groups.indexOf(g) + '"><div class="ghead">step ' + g.s + " · " + esc(first.q) +
        (first.gold != null ? " · gold " + esc(first.gold) : "") + " · rewards " + rewards + '</div><div class="row">' +
        members.map(function (i) { return card(i, true); }).join("") + "</div></div>";
    }).join("");
  }

  function viewCompare() {
    var ps = D.pairs.filter(function (p) {
      if (F.kind && p.k !== F.kind) return false;
      return [p.a, p.b].some(function (i) { return i != null && passes(D.cards[i]); });
    });
    setCount(ps.length, "question" + (ps.length === 1 ? "" : "s") + " match");
    var names = { fixed: "fixed", broken: "broken", both_right: "right both", both_wrong: "wrong both", unknown: "no gold" };
    return pageOf(ps, PER_PAGE.compare).map(function (p) {
      return '<div class="pair" data-kind="' + p.k + '"><div class="kind ' + p.k + '">' + names[p.k] + "</div>" +
        (p.a != null ? card(p.a, false) : '<div class="card">no answer from ' + esc(D.policies[0]) + "</div>") +
        (p.b != null ? card(p.b, false) : '<div class="card">no answer from ' + esc(D.policies[1]) + "</div>") + "</div>";
    }).join("");
  }

  function viewTests() {
    var byQuery = {}, order = [];
    D.cards.forEach(function (c, i) {
      if (!c.ut || !c.ut.length || !passes(c)) return;
      if (!byQuery[c.q]) { byQuery[c.q] = []; order.push(c.q); }
      byQuery[c.q].push(i);
    });
    setCount(order.length, "question" + (order.length === 1 ? "" : "s") + " with unit tests match");
    return pageOf(order, PER_PAGE.tests).map(function (q) {
      var ids = byQuery[q], tests = D.cards[ids[0]].ut;
      var head = "<tr><th>" + esc(q) + "</th>" + tests.map(function (t) {
        var img = t.img == null ? null : D.images[t.img];
        return "<th>" + (img ? '<img src="' + esc(img.src) + '" alt="">' : "(no image)") + esc(t.cap) + "<br>expects <b>" +
          esc(t.exp) + "</b></th>";
      }).join("") + "</tr>";
      var rows = ids.map(function (i) {
        var c = D.cards[i];
        return '<tr data-card="' + i + '"><td>step ' + c.s + " · " + esc(c.st) + " · unit_tests " + fmt((c.comp || {}).unit_tests) +
          "</td>" + c.ut.map(function (t) {
            var ok = t.sc != null && t.sc >= 0.5;
            return '<td><span class="' + (ok ? "pass" : "fail") + '">' + (ok ? "pass" : "fail") + "</span> " +
              esc(t.ans == null ? t.st : t.ans) + "</td>";
          }).join("") + "</tr>";
      }).join("");
      return '<table class="ut">' + head + rows + "</table>";
    }).join("");
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
    $("main").innerHTML = views[state.view]();
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
