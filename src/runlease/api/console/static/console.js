/* runlease console: local times, copy buttons, confirmations, select-all,
   and a run's live event stream. Everything a run emitted is hostile text:
   it is only ever set with textContent, never parsed as HTML. */
(function () {
  "use strict";

  function localTimes(root) {
    root.querySelectorAll("time[datetime]:not([data-local])").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) {
        el.textContent = d.toLocaleString();
        el.setAttribute("data-local", "1");
      }
    });
  }

  function copyButtons(root) {
    root.querySelectorAll("[data-copy]:not([data-wired])").forEach(function (btn) {
      btn.setAttribute("data-wired", "1");
      btn.addEventListener("click", function () {
        var field = document.querySelector(btn.getAttribute("data-copy"));
        if (!field) { return; }
        var done = function () { btn.textContent = "Copied"; };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(field.value).then(done, function () {
            field.select(); document.execCommand("copy"); done();
          });
        } else {
          field.select(); document.execCommand("copy"); done();
        }
      });
    });
  }

  document.addEventListener("submit", function (e) {
    var msg = e.target.getAttribute && e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  }, true);

  document.addEventListener("change", function (e) {
    var cls = e.target.getAttribute && e.target.getAttribute("data-select-all");
    if (cls) {
      document.querySelectorAll("input." + cls).forEach(function (box) {
        box.checked = e.target.checked;
      });
    }
  });

  /* -- the event stream ------------------------------------------------- */

  var MAX_BLOCKS = 2000;
  var MAX_TEXT = 200000;

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }

  function stamp(iso) {
    var t = el("time");
    var d = new Date(iso);
    t.setAttribute("datetime", iso);
    t.title = isNaN(d) ? iso : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    t.textContent = isNaN(d) ? iso : d.toLocaleTimeString();
    t.setAttribute("data-local", "1");
    return t;
  }

  function appendText(pre, text) {
    var now = pre.textContent;
    if (now.length < MAX_TEXT) { pre.textContent = (now + text).slice(0, MAX_TEXT); }
  }

  function EventView(list) {
    this.list = list;
    this.last = null;   /* {kind, key, pre} of the last block, to extend */
    this.empty = document.getElementById("events-empty");
  }

  EventView.prototype.add = function (li) {
    if (this.empty) { this.empty.hidden = true; }
    this.list.appendChild(li);
    while (this.list.children.length > MAX_BLOCKS) { this.list.removeChild(this.list.firstChild); }
  };

  EventView.prototype.block = function (ev, cls, title, collapsible) {
    var li = el("li", "ev " + cls);
    li.setAttribute("data-kind", ev.kind);
    li.setAttribute("data-seq", String(ev.seq));
    var head = el(collapsible ? "summary" : "div", "ev-head");
    head.appendChild(stamp(ev.created_at));
    head.appendChild(document.createTextNode(" "));
    head.appendChild(el("b", null, title));
    var pre = el("pre");
    if (collapsible) {
      var det = el("details");
      det.appendChild(head);
      det.appendChild(pre);
      li.appendChild(det);
    } else {
      li.appendChild(head);
      li.appendChild(pre);
    }
    this.add(li);
    return pre;
  };

  /* The message being streamed is complete: no more cursor. */
  EventView.prototype.settle = function () {
    this.list.querySelectorAll(".streaming").forEach(function (li) {
      li.classList.remove("streaming");
    });
  };

  EventView.prototype.show = function (ev) {
    var data = ev.data || {};
    var kind = ev.kind;
    var last = this.last;
    if (last && last.kind !== kind && /\.delta$/.test(last.kind)) { this.settle(); }
    if (/\.delta$/.test(kind)) {
      var text = typeof data.text === "string" ? data.text : "";
      if (!(last && last.kind === kind)) {
        var pre = this.block(ev, "message streaming", kind.replace(/\.delta$/, ""), false);
        last = this.last = {kind: kind, key: null, pre: pre};
      }
      appendText(last.pre, text);
      return;
    }
    if (kind === "message") {
      var body = typeof data.text === "string" ? data.text
        : typeof data.content === "string" ? data.content : JSON.stringify(data, null, 2);
      if (last && last.kind === "message.delta") {
        if (typeof data.content === "string" && data.content.length >= last.pre.textContent.length) {
          last.pre.textContent = data.content.slice(0, MAX_TEXT);
        }
        this.last = null;
        return;
      }
      this.block(ev, "message", data.role ? "message (" + data.role + ")" : "message", false)
        .textContent = body.slice(0, MAX_TEXT);
      this.last = null;
      return;
    }
    if (kind === "tool.output") {
      var key = String(data.step !== undefined ? data.step : "") + "/" + String(data.stream || "");
      if (!(last && last.kind === kind && last.key === key)) {
        var title = "tool output" + (data.step !== undefined ? " · step " + data.step : "") +
          (data.stream ? " · " + data.stream : "");
        last = this.last = {kind: kind, key: key, pre: this.block(ev, "tool", title, true)};
        /* Open while it streams: the output is what one watches a tool for. */
        last.pre.parentNode.open = true;
      }
      appendText(last.pre, typeof data.text === "string" ? data.text : "");
      return;
    }
    this.last = null;
    if (kind.indexOf("run.") === 0) {
      var parts = [kind.slice(4)];
      if (data.attempt !== undefined) { parts.push("attempt " + data.attempt); }
      if (data.error_code) { parts.push(String(data.error_code)); }
      var pre2 = this.block(ev, "lifecycle " + kind.slice(4), parts.join(" · "), false);
      if (data.error_message) { pre2.textContent = String(data.error_message).slice(0, MAX_TEXT); }
      else { pre2.remove(); }
      return;
    }
    var label = kind;
    if (data.name) { label += " · " + String(data.name); }
    if (kind === "tool.exit") {
      if (data.step !== undefined) { label += " · step " + String(data.step); }
      if (data.returncode !== undefined) { label += " · exit " + String(data.returncode); }
      if (typeof data.duration_s === "number") { label += " · took " + data.duration_s.toFixed(2) + " s"; }
    }
    this.block(ev, kind.indexOf("tool.") === 0 ? "tool" : "other", label, true)
      .textContent = JSON.stringify(data, null, 2).slice(0, MAX_TEXT);
  };

  function parseBlock(block) {
    var out = {id: null, event: "message", data: []};
    block.split("\n").forEach(function (line) {
      if (!line || line[0] === ":") { return; }
      var i = line.indexOf(":");
      var field = i < 0 ? line : line.slice(0, i);
      var value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (field === "id") { out.id = value; }
      else if (field === "event") { out.event = value; }
      else if (field === "data") { out.data.push(value); }
    });
    return out;
  }

  function follow(list) {
    var view = new EventView(list);
    var state = document.getElementById("stream-state");
    var url = list.getAttribute("data-stream");
    var after = 0;
    var ended = false;
    var say = function (text) { if (state) { state.textContent = text; } };

    function handle(msg) {
      if (msg.event === "end") {
        ended = true;
        var end = {};
        try { end = JSON.parse(msg.data.join("\n")); } catch (e) { /* keep {} */ }
        view.settle();
        say("ended: " + String(end.status || "finished"));
        list.setAttribute("data-ended", String(end.status || ""));
        document.body.dispatchEvent(new Event("run-ended"));
        return;
      }
      if (!msg.data.length) { return; }
      var ev;
      try { ev = JSON.parse(msg.data.join("\n")); } catch (e) { return; }
      if (typeof ev.seq === "number") {
        if (ev.seq <= after) { return; }
        after = ev.seq;
      }
      view.show(ev);
    }

    function connect() {
      var target = url + (after ? "&after=" + after : "");
      say("live");
      return fetch(target, {headers: {"Accept": "text/event-stream"}, credentials: "same-origin"})
        .then(function (res) {
          if (!res.ok || !res.body) { throw new Error("HTTP " + res.status); }
          var reader = res.body.getReader();
          var decoder = new TextDecoder();
          var buf = "";
          function pump() {
            return reader.read().then(function (r) {
              if (r.done) { return; }
              buf += decoder.decode(r.value, {stream: true}).replace(/\r\n?/g, "\n");
              var cut;
              while ((cut = buf.indexOf("\n\n")) >= 0) {
                handle(parseBlock(buf.slice(0, cut)));
                buf = buf.slice(cut + 2);
              }
              return pump();
            });
          }
          return pump();
        });
    }

    function loop() {
      connect().catch(function () { /* retried below */ }).then(function () {
        if (ended) { return; }
        say("reconnecting…");
        /* The stream token may have expired: ask for a fresh one. */
        setTimeout(function () {
          fetch(list.getAttribute("data-refresh"), {credentials: "same-origin"})
            .then(function (r) { return r.ok ? r.json() : null; })
            .then(function (j) { if (j && j.url) { url = j.url; } })
            .catch(function () { /* keep the old url */ })
            .then(loop);
        }, 2000);
      });
    }
    loop();
  }

  function wire(root) {
    /* datetime-local fields are in this browser's zone: tell the server which. */
    root.querySelectorAll("input[data-tz]").forEach(function (el) {
      el.value = String(new Date().getTimezoneOffset());
    });
    localTimes(root);
    copyButtons(root);
  }

  document.addEventListener("DOMContentLoaded", function () {
    wire(document);
    var list = document.getElementById("events");
    if (list && list.getAttribute("data-stream")) { follow(list); }
    document.body.addEventListener("htmx:afterSettle", function (e) { wire(e.target); });
  });
}());
