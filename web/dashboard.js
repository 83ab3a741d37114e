/* dashboard.js — live view of /dashboard/events (one JSON message per second: the eBPF
 * monitor's snapshot and the server's stats). Charts keep the last WINDOW seconds. */
(function () {
  "use strict";
  var WINDOW = 180;
  var $ = function (id) { return document.getElementById(id); };
  var mb = function (b) { return (b / 1e6).toFixed(1); };
  var num = function (n) { return Math.round(n).toLocaleString("en-US"); };

  var series = { t: [], h2d: [], d2h: [], tx: [], rx: [], cont: [] };
  var charts = {};

  function mkChart(el, names, colors) {
    var s = [{}];
    names.forEach(function (n, i) { s.push({ label: n, stroke: colors[i], width: 2 }); });
    var w = Math.max(320, Math.min(560, (window.innerWidth - 80) / 3));
    return new uPlot({ width: w, height: 200, series: s, scales: { x: { time: true } },
                       axes: [{}, { size: 50 }] }, [[]].concat(names.map(function () { return []; })), el);
  }

  function push(arr, v) { arr.push(v); if (arr.length > WINDOW) arr.shift(); }

  function gpuCards(gpus) {
    var box = $("gpus");
    box.textContent = "";
    gpus.forEach(function (g) {
      var d = document.createElement("div");
      d.className = "card" + (g.contention > 0.5 ? " hot" : "");
      d.id = "gpu-" + g.index;
      d.innerHTML = "GPU " + g.index + " contention <b class='contention'>" + g.contention.toFixed(3) +
        "</b><br>link " + g.link_gbs.toFixed(1) + " GB/s (" + g.link + ")<br>others H2D " +
        mb(g.other_h2d_bytes_per_s) + " · D2H " + mb(g.other_d2h_bytes_per_s) + " MB/s" +
        (g.nvml_rx_bytes_per_s !== undefined ? "<br>NVML rx " + mb(g.nvml_rx_bytes_per_s) + " · tx " +
         mb(g.nvml_tx_bytes_per_s) + " MB/s" : "");
      box.appendChild(d);
    });
  }

  function procTable(procs) {
    var tb = $("procs").tBodies[0];
    tb.textContent = "";
    procs.slice(0, 50).forEach(function (p) {
      var tr = document.createElement("tr");
      var calls = p.h2d_calls + p.d2h_calls + p.d2d_calls + p.other_calls;
      [p.pid, p.comm, mb(p.h2d_bytes_per_s), mb(p.d2h_bytes_per_s), num(p.h2d_bytes), num(p.d2h_bytes), num(calls),
       mb(p.sock_tx_bytes_per_s), mb(p.sock_rx_bytes_per_s), num(p.sock_tx_bytes), num(p.sock_rx_bytes)]
        .forEach(function (v) { var td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
      tr.dataset.pid = p.pid;
      tb.appendChild(tr);
    });
  }

  function serverStats(obj) {
    var dl = $("server");
    if (!obj) return;
    dl.textContent = "";
    (function walk(prefix, o) {
      Object.keys(o).forEach(function (k) {
        var v = o[k], key = prefix ? prefix + "." + k : k;
        if (v !== null && typeof v === "object" && !Array.isArray(v)) return walk(key, v);
        var dt = document.createElement("dt"), dd = document.createElement("dd");
        dt.textContent = key;
        dd.textContent = Array.isArray(v) ? v.join(", ") : (typeof v === "number" ? +v.toFixed(3) : String(v));
        dl.appendChild(dt); dl.appendChild(dd);
      });
    })("", obj);
  }

  function update(ev) {
    var m = ev.monitor, st = $("status");
    if (!m || !m.bpf) {
      st.textContent = "eBPF off: " + (ev.monitor_off || "monitor not running");
      st.className = "status off";
    } else {
      st.textContent = "eBPF on";
      st.className = "status on";
    }
    var server = {};
    if (ev.engine) server.engine = ev.engine;
    if (ev.server) server.server = ev.server;
    if (Object.keys(server).length) serverStats(server);
    if (!m) return;
    $("uptime").textContent = Math.round(m.t);
    $("uprobes").textContent = m.uprobes;
    $("libs").textContent = m.cuda_libs;
    var s = { h2d: 0, d2h: 0, tx: 0, rx: 0, h2dT: 0, d2hT: 0, txT: 0, rxT: 0 };
    m.processes.forEach(function (p) {
      s.h2d += p.h2d_bytes_per_s; s.d2h += p.d2h_bytes_per_s;
      s.tx += p.sock_tx_bytes_per_s; s.rx += p.sock_rx_bytes_per_s;
      s.h2dT += p.h2d_bytes; s.d2hT += p.d2h_bytes; s.txT += p.sock_tx_bytes; s.rxT += p.sock_rx_bytes;
    });
    $("h2d-rate").textContent = mb(s.h2d); $("d2h-rate").textContent = mb(s.d2h);
    $("sock-tx-rate").textContent = mb(s.tx); $("sock-rx-rate").textContent = mb(s.rx);
    $("h2d-total").textContent = num(s.h2dT); $("d2h-total").textContent = num(s.d2hT);
    $("sock-tx-total").textContent = num(s.txT); $("sock-rx-total").textContent = num(s.rxT);
    gpuCards(m.gpus);
    procTable(m.processes);

    var now = Date.now() / 1000;
    push(series.t, now);
    push(series.h2d, s.h2d / 1e6); push(series.d2h, s.d2h / 1e6);
    push(series.tx, s.tx / 1e6); push(series.rx, s.rx / 1e6);
    push(series.cont, m.gpus.length ? Math.max.apply(null, m.gpus.map(function (g) { return g.contention; })) : 0);
    if (!charts.pcie) {
      charts.pcie = mkChart($("chart-pcie"), ["H2D", "D2H"], ["#2e86de", "#e67e22"]);
      charts.sock = mkChart($("chart-sock"), ["TX", "RX"], ["#27ae60", "#8e44ad"]);
      charts.cont = mkChart($("chart-cont"), ["max over GPUs"], ["#c0392b"]);
    }
    charts.pcie.setData([series.t, series.h2d, series.d2h]);
    charts.sock.setData([series.t, series.tx, series.rx]);
    charts.cont.setData([series.t, series.cont]);
    document.body.dataset.updates = (+(document.body.dataset.updates || 0) + 1).toString();
  }

  var es = new EventSource("/dashboard/events");
  es.onmessage = function (e) {
    try { update(JSON.parse(e.data)); } catch (err) { $("status").textContent = "bad event: " + err; }
  };
  es.onerror = function () { $("status").textContent = "disconnected, retrying…"; $("status").className = "status off"; };
})();
