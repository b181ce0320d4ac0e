// The workload page's live parts: the logs and the terminal, each a WebSocket to the console carrying tunnel frames
// (common/tunnel.py: op byte, stream id as 4 bytes big-endian, payload). The terminal sends DATA, RESIZE and EOF on
// stream 0; everything else comes from the container.
(function () {
  "use strict";
  var OP = { DATA: 1, STDERR: 2, EOF: 4, CLOSE: 5, RESIZE: 6, EXIT: 7, ERROR: 8 };
  var encoder = new TextEncoder();

  function frame(op, payload) {
    var bytes = new Uint8Array(5 + payload.length);
    bytes[0] = op; // bytes 1..4: stream 0
    bytes.set(payload, 5);
    return bytes;
  }
  function parse(buffer) {
    var view = new DataView(buffer);
    return { op: view.getUint8(0), stream: view.getUint32(1), payload: new Uint8Array(buffer, 5) };
  }
  function socketTo(path) {
    var socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
    socket.binaryType = "arraybuffer";
    return socket;
  }

  function followLogs(pre) {
    var status = document.getElementById("logs-status");
    var decoder = new TextDecoder();
    var ended = false;
    var socket = socketTo(pre.getAttribute("data-socket"));
    socket.onopen = function () { status.textContent = "Following the logs: the last 200 lines, then new ones as they come."; };
    socket.onmessage = function (event) {
      var f = parse(event.data);
      if (f.op === OP.DATA || f.op === OP.STDERR) {
        var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.appendChild(document.createTextNode(decoder.decode(f.payload, { stream: true })));
        if (atEnd) pre.scrollTop = pre.scrollHeight;
      } else if (f.op === OP.ERROR) {
        ended = true;
        status.textContent = "Logs unavailable: " + decoder.decode(f.payload);
        if (!pre.textContent) pre.hidden = true;
      } else if (f.op === OP.EXIT || f.op === OP.CLOSE) {
        ended = true;
        status.textContent = "The logs ended" + (f.op === OP.CLOSE && f.payload.length ? ": " + decoder.decode(f.payload) : ".");
      }
    };
    socket.onclose = function (event) {
      if (!ended) status.textContent = "The logs connection closed" + (event.reason ? ": " + event.reason : ".");
    };
  }

  function openTerminal(button) {
    var box = document.getElementById("terminal");
    var status = document.getElementById("terminal-status");
    if (typeof Terminal === "undefined") { status.textContent = "The terminal's script did not load."; return; }
    button.hidden = true;
    box.hidden = false;
    var term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 2000 });
    var fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    var decoder = new TextDecoder();
    var path = button.getAttribute("data-socket") + "?cols=" + term.cols + "&rows=" + term.rows;
    var socket = socketTo(path);
    socket.onopen = function () {
      status.textContent = "Connected. Shift+Escape leaves the terminal (keyboard focus moves on).";
      term.focus();
    };
    socket.onmessage = function (event) {
      var f = parse(event.data);
      if (f.op === OP.DATA || f.op === OP.STDERR) term.write(f.payload);
      else if (f.op === OP.EXIT) { var code = JSON.parse(decoder.decode(f.payload)).code; term.write("\r\n[exited with code " + code + "]\r\n"); status.textContent = "The shell exited with code " + code + "."; }
      else if (f.op === OP.ERROR) status.textContent = "Terminal: " + decoder.decode(f.payload);
    };
    socket.onclose = function (event) {
      if (!/exited/.test(status.textContent) && !/^Terminal:/.test(status.textContent))
        status.textContent = "The terminal closed" + (event.reason ? ": " + event.reason : ".");
    };
    term.onData(function (data) { if (socket.readyState === 1) socket.send(frame(OP.DATA, encoder.encode(data))); });
    term.onResize(function (size) {
      if (socket.readyState === 1) socket.send(frame(OP.RESIZE, encoder.encode(JSON.stringify({ cols: size.cols, rows: size.rows }))));
    });
    term.attachCustomKeyEventHandler(function (event) {
      if (event.type === "keydown" && event.key === "Escape" && event.shiftKey) { term.blur(); status.focus(); return false; }
      return true;
    });
    status.tabIndex = -1;
    window.addEventListener("resize", function () { fit.fit(); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var pre = document.getElementById("logs");
    if (pre) followLogs(pre);
    var button = document.getElementById("terminal-open");
    if (button) button.addEventListener("click", function () { openTerminal(button); });
  });
})();
