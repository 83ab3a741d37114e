#!/usr/bin/env python3
"""The OpenAI API of `semflow serve`, tested from outside as a client would: the real binary on
the demo model (CPU backend) on a free loopback port.

Covers streaming and whole responses of both endpoints, greedy output equal to `semflow
generate`, seeds, stop strings, n, logprobs, echo and prompt logprobs, the prefix cache's usage and salt, prompt truncation, guided_choice, guided_regex, GBNF grammars, speculative decoding, tokenize
routes, metrics, more than 30 bad inputs
(each must get the right status and leave the server serving), half-open connections, and a
client that disconnects mid-stream (its KV blocks must be freed)."""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import BIN, ServerProcess, check, results  # noqa: E402


class Server(ServerProcess):
    def __init__(self, *args):
        super().__init__(["--model", "demo"] + list(args))

    def request(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data

    def json(self, path, body, headers=None):
        st, h, data = self.request("POST", path, body, headers)
        try:
            return st, h, json.loads(data)
        except ValueError:
            return st, h, {"raw": data[:200]}

    def stream(self, path, body, headers=None):
        """Returns (status, list of decoded SSE payloads, saw [DONE])."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", path, body=json.dumps(body), headers=headers or {})
        r = c.getresponse()
        events, done = [], False
        if r.status != 200:
            r.read()
            return r.status, events, done
        for line in r:
            line = line.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            events.append(json.loads(line[6:]))
        c.close()
        return r.status, events, done

    def metric(self, name):
        st, _, data = self.request("GET", "/metrics")
        for line in data.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def alive(self):
        try:
            return self.request("GET", "/health", timeout=10)[0] == 200
        except OSError:
            return False


def generate_cli(prompt, max_tokens):
    out = subprocess.run([BIN, "generate", "--model", "demo", "--prompt", prompt, "--max-tokens", str(max_tokens),
                          "--temperature", "0"], capture_output=True, timeout=300)
    return out.returncode, out.stdout.decode("utf-8", "replace")


def test_api(s):
    st, _, models = s.json("/v1/models", None) if False else (None, None, None)
    st, _, data = s.request("GET", "/v1/models")
    models = json.loads(data)
    model = models["data"][0]["id"] if st == 200 and models.get("data") else None
    check("models_lists_the_model", st == 200 and model and models["object"] == "list", data[:200])

    prompt = "Once upon a time"
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    st, h, r = s.json("/v1/completions", body, {"X-Semantic-Intent": "interactive; max-latency=2s"})
    check("intent_applied_header", h.get("x-semantic-intent-applied") == "interactive; urgency=high; max-latency=2000ms",
          h.get("x-semantic-intent-applied"))
    ok = st == 200 and r.get("object") == "text_completion" and len(r.get("choices", [])) == 1
    check("completions_whole", ok and r["usage"]["completion_tokens"] == 12 and
          r["choices"][0]["finish_reason"] == "length", r)
    greedy = r["choices"][0]["text"] if ok else ""

    st, ev, done = s.stream("/v1/completions", dict(body, stream=True))
    text = "".join(e["choices"][0]["text"] for e in ev if e.get("choices"))
    check("completions_stream_equals_whole", st == 200 and done and text == greedy, "%r vs %r" % (text, greedy))
    finals = [e["choices"][0]["finish_reason"] for e in ev if e.get("choices") and e["choices"][0]["finish_reason"]]
    check("completions_stream_finish_reason", finals == ["length"], finals)

    rc, cli_text = generate_cli(prompt, 12)
    check("greedy_equals_generate", rc == 0 and cli_text.strip() == greedy.strip(),
          "server %r vs generate %r (rc %d)" % (greedy, cli_text, rc))

    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
            "max_tokens": 10, "temperature": 0, "model": model}
    st, _, r = s.json("/v1/chat/completions", chat)
    ok = st == 200 and r.get("object") == "chat.completion"
    check("chat_whole", ok and r["choices"][0]["message"]["role"] == "assistant" and
          r["usage"]["prompt_tokens"] > 0, r)
    whole = r["choices"][0]["message"]["content"] if ok else None
    st, ev, done = s.stream("/v1/chat/completions", dict(chat, stream=True, stream_options={"include_usage": True}))
    roles = [e["choices"][0]["delta"].get("role") for e in ev if e.get("choices")]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e.get("choices"))
    usage = [e["usage"] for e in ev if e.get("usage")]
    check("chat_stream_equals_whole", st == 200 and done and roles[:1] == ["assistant"] and text == whole,
          "%r vs %r" % (text, whole))
    check("chat_stream_usage", len(usage) == 1 and usage[0]["completion_tokens"] == r["usage"]["completion_tokens"],
          usage)

    seeded = {"prompt": "The dog", "max_tokens": 16, "temperature": 1.0, "seed": 1234, "ignore_eos": True}
    a = s.json("/v1/completions", seeded)[2]
    b = s.json("/v1/completions", seeded)[2]
    check("same_seed_same_text", a.get("choices") and a["choices"][0]["text"] == b["choices"][0]["text"], (a, b))

    # stop strings: cut the greedy text at a piece of itself
    long = s.json("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True})[2]
    g = long["choices"][0]["text"] if long.get("choices") else ""
    stop = None
    for k in range(2, len(g) - 2):
        cand = g[k:k + 2]
        if cand.strip() and g.find(cand) == k:
            stop = cand
            break
    if stop:
        r = s.json("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                                       "stop": [stop]})[2]
        t = r["choices"][0]["text"] if r.get("choices") else None
        check("stop_string_cuts", t == g[:g.find(stop)] and r["choices"][0]["finish_reason"] == "stop",
              "stop %r: %r, want %r" % (stop, t, g[:g.find(stop)]))
    else:
        check("stop_string_cuts", False, "no usable stop string in %r" % g)

    st, _, r = s.json("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "n": 3, "temperature": 1, "seed": 7})
    check("n_choices", st == 200 and sorted(c["index"] for c in r["choices"]) == [0, 1, 2] and
          r["usage"]["completion_tokens"] >= 3, r)

    st, _, r = s.json("/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=2, max_tokens=5))
    lp = r["choices"][0]["logprobs"]["content"] if st == 200 else []
    check("chat_logprobs", len(lp) == r["usage"]["completion_tokens"] and
          all(x["logprob"] <= 0 and 1 <= len(x["top_logprobs"]) <= 2 for x in lp), lp[:2])
    st, _, r = s.json("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "logprobs": 2, "temperature": 0})
    lp = r["choices"][0]["logprobs"] if st == 200 else {}
    check("completions_logprobs", st == 200 and len(lp.get("tokens", [])) == len(lp.get("token_logprobs", [])) ==
          r["usage"]["completion_tokens"], lp)

    # logit_bias: +100 on one id makes greedy decoding draw only it; -100 on the greedy path's
    # first token moves the first token elsewhere; on the host path (logprobs) as on the backend's
    _, _, t = s.json("/tokenize", {"prompt": " the"})
    tid = t["tokens"][-1]
    _, _, d = s.json("/detokenize", {"tokens": [tid] * 4})
    for lp in (None, 0):
        body = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                "logit_bias": {str(tid): 100}}
        if lp is not None: body["logprobs"] = lp
        st, _, r = s.json("/v1/completions", body)
        got = r["choices"][0]["text"] if st == 200 else r
        check("logit_bias_forces_token" + ("_host" if lp is not None else ""), st == 200 and got == d["prompt"],
              "%r, want %r" % (got, d["prompt"]))
    base = {"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0, "logprobs": 0}
    _, _, r0 = s.json("/v1/completions", base)
    first = r0["choices"][0]["logprobs"]["tokens"][0]
    _, _, t = s.json("/tokenize", {"prompt": first, "add_special_tokens": False})
    fid = t["tokens"][0] if len(t["tokens"]) == 1 else None
    st, _, r = s.json("/v1/completions", dict(base, logit_bias={str(fid): -100})) if fid is not None else (0, 0, {})
    check("logit_bias_bans_token", st == 200 and r["choices"][0]["logprobs"]["tokens"][0] != first,
          (first, fid, r))
    st, _, r = s.json("/v1/completions", dict(base, logit_bias={}))
    check("logit_bias_empty_is_none", st == 200 and r["choices"][0]["logprobs"]["tokens"][0] == first, r)

    # stop_token_ids: the output ends with the first occurrence of the token, shown (it is not
    # special), finish_reason stop; a special one (EOS) ends it unseen
    base = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    _, _, r0 = s.json("/v1/completions", base)
    toks = r0["choices"][0]["logprobs"]["tokens"]
    _, _, t = s.json("/tokenize", {"prompt": toks[2], "add_special_tokens": False})
    sid = t["tokens"][0] if len(t["tokens"]) == 1 else None
    want = "".join(toks[:toks.index(toks[2]) + 1])
    st, _, r = s.json("/v1/completions", dict(base, stop_token_ids=[sid])) if sid is not None else (0, 0, {})
    got = (r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]) if st == 200 else r
    check("stop_token_ids_ends_shown", got == (want, "stop", toks.index(toks[2]) + 1), "%r, want %r" % (got, want))
    st, _, r = s.json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
                                          "logit_bias": {str(sid): 100}, "stop_token_ids": [sid]})
    check("stop_token_ids_first_token", st == 200 and r["choices"][0]["text"] == toks[2] and
          r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1, r)

    # min_tokens: the stop id, forced by logit_bias, is kept out of the first 3 tokens and ends the
    # output at the 4th; on the backend's sample op and on the host path (logprobs)
    for lp in (None, 0):
        body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "min_tokens": 3,
                "logit_bias": {str(sid): 100}, "stop_token_ids": [sid]}
        if lp is not None: body["logprobs"] = lp
        st, _, r = s.json("/v1/completions", body)
        c = r["choices"][0] if st == 200 else {}
        check("min_tokens_holds_stop_id" + ("_host" if lp is not None else ""),
              st == 200 and c["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 4 and
              c["text"].endswith(toks[2]) and (lp is None or toks[2] not in c["logprobs"]["tokens"][:3]), r)

    # nor does a stop string end it before min_tokens (vLLM): the second token's text as the stop
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stop": [toks[1]]}
    st, _, r = s.json("/v1/completions", body)
    cut = r["choices"][0]["text"] if st == 200 else r
    st, _, r = s.json("/v1/completions", dict(body, min_tokens=5))
    c = r["choices"][0] if st == 200 else {}
    check("min_tokens_holds_stop_string", st == 200 and cut == toks[0] and c["text"].startswith("".join(toks[:5])) and
          r["usage"]["completion_tokens"] >= 5, (toks, cut, r))

    st, _, r = s.json("/v1/completions", dict(body, include_stop_str_in_output=True))
    check("include_stop_str_in_output", st == 200 and r["choices"][0]["text"] == toks[0] + toks[1] and
          r["choices"][0]["finish_reason"] == "stop", (toks, r))
    # skip_special_tokens: a special token (BOS, forced) is empty text by default, its piece when false
    _, _, t = s.json("/tokenize", {"prompt": "a"})
    _, _, t2 = s.json("/tokenize", {"prompt": "a", "add_special_tokens": False})
    bos = t["tokens"][0] if len(t["tokens"]) == len(t2["tokens"]) + 1 else None
    body = {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0, "ignore_eos": True,
            "logit_bias": {str(bos): 100}}
    st, _, r = s.json("/v1/completions", body) if bos is not None else (0, 0, {})
    st2, _, r2 = s.json("/v1/completions", dict(body, skip_special_tokens=False)) if bos is not None else (0, 0, {})
    check("skip_special_tokens", st == 200 and st2 == 200 and r["choices"][0]["text"] == "" and
          len(r2["choices"][0]["text"]) > 0 and r2["usage"]["completion_tokens"] == 2, (bos, r, r2))

    st, _, t = s.json("/tokenize", {"prompt": "Hello world"})
    st2, _, d = s.json("/detokenize", {"tokens": t.get("tokens", [])})
    check("tokenize_roundtrip", st == 200 and st2 == 200 and t["count"] == len(t["tokens"]) and
          "Hello world" in d.get("prompt", ""), (t, d))

    st, h, data = s.request("GET", "/metrics")
    text = data.decode()
    want = ["semflow_requests_total{", "semflow_time_to_first_token_seconds_bucket", "semflow_inter_token_latency_seconds",
            "semflow_e2e_request_latency_seconds", "semflow_queue_depth{lane=\"high\"}", "semflow_running_sequences",
            "semflow_kv_blocks_used", "semflow_kv_blocks_free", "semflow_tokens_per_second", "semflow_preemptions_total"]
    missing = [w for w in want if w not in text]
    check("metrics_exposition", st == 200 and h.get("content-type", "").startswith("text/plain") and not missing, missing)
    return model


def test_json_mode(s):
    """response_format json_object: every output that ends (finish_reason stop) is one JSON object,
    in both routes, streamed or not; the end-of-sequence token comes only when the object is done
    (forced here: '}' all but forced by logit_bias closes it at once); json_schema: such outputs
    are instances of the schema; what cannot be kept is a 400."""
    chat = {"messages": [{"role": "user", "content": "Describe a cat as JSON."}],
            "response_format": {"type": "json_object"}, "max_tokens": 400}
    stops, bad = 0, []
    for seed in range(1, 9):
        st, _, r = s.json("/v1/chat/completions", dict(chat, seed=seed))
        c = r["choices"][0] if st == 200 else {}
        if c.get("finish_reason") == "stop":
            stops += 1
            try:
                if not isinstance(json.loads(c["message"]["content"]), dict):
                    bad.append((seed, c["message"]["content"][:80]))
            except ValueError as e:
                bad.append((seed, str(e), c["message"]["content"][:80]))
        elif st != 200 or c.get("finish_reason") != "length" or not c["message"]["content"].lstrip().startswith("{"):
            bad.append((seed, st, r))
    check("json_mode_chat_outputs_are_objects", stops >= 1 and not bad, "%d ended: %r" % (stops, bad))

    _, _, t = s.json("/tokenize", {"prompt": "}", "add_special_tokens": False})
    close = t["tokens"][0] if len(t["tokens"]) == 1 else None
    body = {"prompt": "JSON:", "max_tokens": 300, "temperature": 0, "logit_bias": {str(close): 100},
            "response_format": {"type": "json_object"}}
    st, _, r = s.json("/v1/completions", body)
    c = r["choices"][0] if st == 200 else {}
    check("json_mode_ends_with_object", close is not None and c.get("finish_reason") == "stop" and
          json.loads(c["text"]) == {}, (close, r))
    # whitespace between tokens is bounded, so even this greedy random model, which would pad for
    # ever, reaches the object: no run of whitespace longer than SF_JSON_MAX_WS (48)
    runs = re.findall(r"[ \t\r\n]+", c.get("text", ""))
    check("json_mode_whitespace_bounded", runs and max(len(x) for x in runs) <= 48, runs)
    st, events, done = s.stream("/v1/completions", dict(body, stream=True))
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    check("json_mode_streamed", st == 200 and done and text == c.get("text") and
          events[-1]["choices"][0]["finish_reason"] == "stop", (text, events[-1:]))
    st, _, r = s.json("/v1/chat/completions", dict(chat, seed=3, max_tokens=30, logprobs=True, n=2))
    lps = [x["logprob"] for ch in r.get("choices", []) for x in ch["logprobs"]["content"]] if st == 200 else []
    check("json_mode_logprobs_finite", st == 200 and len(lps) > 0 and all(v > -1e30 for v in lps), r)

    # json_schema: the outputs that end are instances (the properties in order, all required here)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "pet": {"enum": ["cat", "dog", None]},
                                               "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
              "required": ["name", "age", "pet", "tags"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    stops, bad = 0, []
    for seed in range(1, 9):
        st, _, r = s.json("/v1/chat/completions", dict(chat, seed=seed, response_format=rf, max_tokens=300))
        c = r["choices"][0] if st == 200 else {}
        if c.get("finish_reason") != "stop":
            if c.get("finish_reason") != "length":
                bad.append((seed, st, r))
            continue
        stops += 1
        try:
            v = json.loads(c["message"]["content"])
            ok = (list(v) == ["name", "age", "pet", "tags"] and isinstance(v["name"], str) and
                  type(v["age"]) is int and v["pet"] in ("cat", "dog", None) and isinstance(v["tags"], list) and
                  len(v["tags"]) <= 3 and all(type(x) is bool for x in v["tags"]))
        except ValueError:
            ok = False
        if not ok:
            bad.append((seed, c["message"]["content"][:200]))
    check("json_schema_outputs_are_instances", stops >= 1 and not bad, "%d ended: %r" % (stops, bad))
    st, events, done = s.stream("/v1/completions", {"prompt": "A person:", "max_tokens": 300, "seed": 5, "stream": True,
                                                    "response_format": rf})
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    fin = events[-1]["choices"][0]["finish_reason"] if events else None
    try:
        streamed_ok = fin == "length" or list(json.loads(text)) == ["name", "age", "pet", "tags"]
    except ValueError:
        streamed_ok = False
    check("json_schema_completions_streamed", st == 200 and done and streamed_ok, (fin, text[:200]))
    # the same schema by vLLM's guided_json (object or text) and llama.cpp's json_object + schema: a
    # one-boolean schema leaves the random model no way but {"ok": true|false}
    ok = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    plain = {k: v for k, v in chat.items() if k != "response_format"}
    for name, extra in (("guided_json", {"guided_json": ok}), ("guided_json_text", {"guided_json": json.dumps(ok)}),
                        ("json_object_schema", {"response_format": {"type": "json_object", "schema": ok}})):
        st, _, r = s.json("/v1/chat/completions", dict(plain, max_tokens=300, temperature=0, **extra))
        c = r["choices"][0] if st == 200 else {}
        try:
            v = json.loads(c["message"]["content"]) if c.get("finish_reason") == "stop" else None
        except ValueError:
            v = None
        check("json_schema_by_" + name, isinstance(v, dict) and list(v) == ["ok"] and isinstance(v["ok"], bool), r)
    for label, extra in (("with_response_format", {"guided_json": ok, "response_format": {"type": "json_object"}}),
                         ("not_json", {"guided_json": "not json"}), ("root_string", {"guided_json": {"type": "string"}})):
        st, _, r = s.json("/v1/chat/completions", dict(plain, **extra))
        check("guided_json_refused_" + label, st == 400 and r["error"]["param"] == "guided_json", r)
    for sch, says in (({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}, "'format'"),
                      ({"type": "array"}, "root"), ({"type": "object", "additionalProperties": True}, "additionalProperties")):
        st, _, r = s.json("/v1/chat/completions",
                          dict(chat, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": sch}}))
        check("json_schema_refused_" + says.strip("'"), st == 400 and r["error"]["param"] == "response_format" and
              says in r["error"]["message"], r)

    for extra, param in (({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
                         ({"response_format": {"type": "yaml"}}, "response_format"),
                         ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
                         ({"response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens")):
        st, _, r = s.json("/v1/chat/completions", dict(chat, **extra))
        check("json_mode_refused_" + param + ("_" + extra["response_format"]["type"] if param == "response_format" else ""),
              st == 400 and r["error"]["param"] == param, r)


def test_tools(s):
    """Chat tools: a forced call (a named function, or "required") comes back as tool_calls with
    finish_reason "tool_calls", whole or streamed; '}' all but forced by logit_bias keeps the
    random demo model's arguments short. History with calls and results renders; what cannot be
    kept is a 400."""
    _, _, t = s.json("/tokenize", {"prompt": "}", "add_special_tokens": False})
    close = t["tokens"][0]
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Current time",
                                                "parameters": {"type": "object", "properties": {}}}},
             {"type": "function", "function": {"name": "add", "parameters": {
                 "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
    base = {"messages": [{"role": "user", "content": "What time is it?"}], "tools": tools, "temperature": 0,
            "max_tokens": 300, "logit_bias": {str(close): 100}}
    named = dict(base, tool_choice={"type": "function", "function": {"name": "get_time"}})
    st, _, r = s.json("/v1/chat/completions", named)
    c = r["choices"][0] if st == 200 else {}
    calls = c.get("message", {}).get("tool_calls") or []
    check("tools_named_call", st == 200 and c["finish_reason"] == "tool_calls" and c["message"]["content"] is None and
          len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_") and
          calls[0]["function"]["name"] == "get_time" and json.loads(calls[0]["function"]["arguments"]) == {}, r)
    st, events, done = s.stream("/v1/chat/completions", dict(named, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    tc = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    check("tools_named_call_streamed", st == 200 and done and len(tc) == 1 and tc[0][0]["index"] == 0 and
          tc[0][0]["function"]["name"] == "get_time" and events[-1]["choices"][0]["finish_reason"] == "tool_calls" and
          not any(d.get("content") for d in deltas), events)
    st, _, r = s.json("/v1/chat/completions", dict(base, tool_choice="required"))
    c = r["choices"][0] if st == 200 else {}
    calls = c.get("message", {}).get("tool_calls") or []
    check("tools_required_call", st == 200 and c["finish_reason"] == "tool_calls" and len(calls) == 1 and
          calls[0]["function"]["name"] in ("get_time", "add") and
          isinstance(json.loads(calls[0]["function"]["arguments"]), dict), r)
    auto = dict(base, tool_choice="auto", max_tokens=20, logit_bias={})
    st, _, r = s.json("/v1/chat/completions", auto)
    check("tools_auto_plain_reply", st == 200 and r["choices"][0]["finish_reason"] in ("stop", "length") and
          isinstance(r["choices"][0]["message"]["content"], str), r)
    # streamed, a reply that is plainly text streams (token by token once it shows it is text);
    # one that starts like a call ('{' forced by logit_bias) is held and sent whole at its end
    want = r["choices"][0]["message"]["content"] if st == 200 else None
    st, events, done = s.stream("/v1/chat/completions", dict(auto, stream=True))
    parts = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    parts = [x for x in parts if x]
    check("tools_auto_text_streams", st == 200 and done and "".join(parts) == want and len(parts) > 1, (want, parts))
    _, _, t = s.json("/tokenize", {"prompt": "{", "add_special_tokens": False})
    brace = {str(t["tokens"][0]): 100}
    st, _, r = s.json("/v1/chat/completions", dict(auto, logit_bias=brace))
    want = r["choices"][0]["message"]["content"] if st == 200 else None
    st, events, done = s.stream("/v1/chat/completions", dict(auto, logit_bias=brace, stream=True))
    parts = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    parts = [x for x in parts if x]
    check("tools_auto_call_like_held", st == 200 and done and want and want.lstrip().startswith("{") and
          parts == [want], (want, parts))
    history = [{"role": "user", "content": "What time is it?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    st, _, r = s.json("/v1/chat/completions", {"messages": history, "tools": tools, "max_tokens": 4})
    check("tools_history_renders", st == 200 and r["choices"][0]["message"]["content"] is not None, r)
    for body, param in (
            (dict(base, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
            ({"messages": base["messages"], "tool_choice": "required"}, "tool_choice"),
            (dict(base, tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools"),
            (dict(base, tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), "tools"),
            (dict(base, tools=[{"type": "retrieval"}]), "tools"),
            (dict(base, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
            (dict(base, messages=[{"role": "assistant", "content": "hi"}]), "messages"),
            (dict(base, messages=[{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "1"}]}]),
             "messages")):
        st, _, r = s.json("/v1/chat/completions", body)
        check("tools_refused_" + param, st == 400 and r["error"]["param"] == param, (body, r))
    st, _, r = s.json("/v1/completions", {"prompt": "x", "tools": tools})
    check("tools_refused_on_completions", st == 400 and r["error"]["param"] == "tools", r)


def test_prompt_logprobs(s):
    """echo (with logprobs, and max_tokens 0 for the prompt alone) and vLLM's prompt_logprobs: a
    prompt's scores equal the logprobs its tokens had when the model generated them."""
    ids = s.json("/tokenize", {"prompt": "Once upon a time", "add_special_tokens": True})[2].get("tokens", [])
    tid = lambda t: int(t.split(":", 1)[1])
    st, _, a = s.json("/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                          "logprobs": 3, "return_tokens_as_token_ids": True})
    lp = a["choices"][0]["logprobs"] if st == 200 else {}
    gen = [tid(t) for t in lp.get("tokens", [])]
    check("tokens_as_token_ids", st == 200 and len(gen) == 6 and all(t.startswith("token_id:") for t in lp["tokens"]), a)
    full = ids + gen
    text = s.json("/detokenize", {"tokens": full})[2].get("prompt")
    body = {"prompt": full, "echo": True, "max_tokens": 0, "logprobs": 3, "prompt_logprobs": 3,
            "return_tokens_as_token_ids": True}
    names = ["semflow_engine_prompt_tokens_scored%s_total" % k for k in ("", "_backend")]
    m0 = [s.metric(n) for n in names]
    st, _, b = s.json("/v1/completions", body)
    # the engine publishes its counters at the end of the turn that delivered the response: poll
    for _ in range(100):
        m1 = [s.metric(n) for n in names]
        if None in m0 + m1 or m1[0] - m0[0] >= len(full) - 1:
            break
        time.sleep(0.05)
    check("prompt_scored_metrics", None not in m0 + m1 and m1[0] - m0[0] == len(full) - 1 and
          m1[1] - m0[1] == len(full) - 1, (m0, m1, len(full)))
    c = b["choices"][0] if st == 200 else {}
    blp = c.get("logprobs") or {}
    n = len(ids)
    near = lambda x, y: x is not None and abs(x - y) < 2e-3
    check("echo_prompt_only", st == 200 and c["text"] == text and c["finish_reason"] == "length" and
          b["usage"]["completion_tokens"] == 0 and b["usage"]["prompt_tokens"] == len(full), b)
    check("echo_logprobs_are_the_prompt", blp.get("tokens") == ["token_id:%d" % t for t in full] and
          blp["token_logprobs"][0] is None and blp["top_logprobs"][0] is None and
          blp["text_offset"] == sorted(blp["text_offset"]) and len(blp["text_offset"]) == len(full), blp)
    check("echo_logprobs_equal_generation", len(blp.get("token_logprobs", [])) == len(full) and
          all(near(blp["token_logprobs"][n + i], lp["token_logprobs"][i]) and
              set(blp["top_logprobs"][n + i]) == set(lp["top_logprobs"][i]) for i in range(6)),
          (blp.get("token_logprobs", [])[n:], lp.get("token_logprobs")))
    pl = c.get("prompt_logprobs") or []
    check("prompt_logprobs_vllm_shape", len(pl) == len(full) and pl[0] is None and
          all(str(full[i]) in pl[i] and pl[i][str(full[i])]["rank"] >= 1 and
              near(pl[i][str(full[i])]["logprob"], blp["token_logprobs"][i]) and 1 <= len(pl[i]) <= 4
              for i in range(1, len(full))) and
          all(pl[n + i][str(gen[i])]["rank"] == 1 for i in range(6)), pl[:3])
    # streamed: the echo (text and logprobs) first, then the end
    st, ev, done = s.stream("/v1/completions", dict(body, stream=True))
    texts = "".join(e["choices"][0]["text"] for e in ev if e.get("choices"))
    first = ev[0]["choices"][0] if ev else {}
    check("echo_stream", st == 200 and done and texts == text and first.get("logprobs", {}).get("tokens") == blp.get("tokens")
          and first.get("prompt_logprobs") == pl and ev[-1]["choices"][0]["finish_reason"] == "length", ev[:2])
    # echo with output: the prompt's text, then the output's, whole and streamed alike; n = 2
    body = {"prompt": "Once upon a time", "echo": True, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "n": 2}
    st, _, w = s.json("/v1/completions", body)
    st2, ev, done = s.stream("/v1/completions", dict(body, stream=True))
    streamed = ["".join(e["choices"][0]["text"] for e in ev if e.get("choices") and e["choices"][0]["index"] == i)
                for i in range(2)]
    check("echo_then_output", st == 200 and st2 == 200 and done and
          all(ch["text"].startswith("Once upon a time") and len(ch["text"]) > len("Once upon a time") and
              ch["text"] == streamed[ch["index"]] for ch in w["choices"]) and w["usage"]["completion_tokens"] == 8,
          (w, streamed))
    # echo, logprobs and output: the prompt's entries, then the output's with offsets past the prompt
    st, _, r = s.json("/v1/completions", dict(body, n=1, logprobs=1))
    elp = r["choices"][0]["logprobs"] if st == 200 else {}
    st20, _, r20 = s.json("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logprobs": 20, "temperature": 0,
                                              "return_tokens_as_token_ids": True})  # ids: no two tops share a key
    check("completions_logprobs_20", st20 == 200 and all(len(t) == 20 for t in r20["choices"][0]["logprobs"]["top_logprobs"]),
          r20)
    check("echo_logprobs_then_output", st == 200 and len(elp["tokens"]) == r["usage"]["prompt_tokens"] + 4 and
          elp["token_logprobs"][0] is None and all(x is not None for x in elp["token_logprobs"][1:]) and
          elp["text_offset"][-4] == len("Once upon a time") and
          all(r["choices"][0]["text"].startswith(tok, off)
              for tok, off in zip(elp["tokens"][1:-4], elp["text_offset"][1:-4])), elp)
    # chat: vLLM's prompt_logprobs beside the choices, one entry per prompt token
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prompt_logprobs": 0}
    st, _, r = s.json("/v1/chat/completions", chat)
    pl = r.get("prompt_logprobs") or []
    check("chat_prompt_logprobs", st == 200 and len(pl) == r["usage"]["prompt_tokens"] and pl[0] is None and
          all(len(x) == 1 and list(x.values())[0]["logprob"] <= 0 for x in pl[1:]), r)
    st, ev, done = s.stream("/v1/chat/completions", dict(chat, stream=True))
    got = [e["prompt_logprobs"] for e in ev if "prompt_logprobs" in e]
    check("chat_prompt_logprobs_stream", st == 200 and done and got == [pl], got)


def test_prompt_batch(s):
    """OpenAI's batch form: several prompts in one completions request, n choices each, indexed
    prompt * n + choice; each choice equals the same prompt sent alone; usage counts each prompt
    once; streamed equals whole; evaluation harnesses' shape (token-id prompts, echo, logprobs,
    max_tokens 0)."""
    a, b = "Once upon a time", "The quick brown fox"
    na = s.json("/tokenize", {"prompt": a})[2].get("count")
    nb = s.json("/tokenize", {"prompt": b})[2].get("count")
    base = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    alone = [s.json("/v1/completions", dict(base, prompt=x))[2]["choices"][0]["text"] for x in (a, b)]
    st, _, r = s.json("/v1/completions", dict(base, prompt=[a, b], n=2))
    ch = sorted(r.get("choices", []), key=lambda c: c["index"]) if st == 200 else []
    check("prompt_batch_choices", st == 200 and [c["index"] for c in ch] == [0, 1, 2, 3] and
          [c["text"] for c in ch] == [alone[0], alone[0], alone[1], alone[1]], (r, alone))
    check("prompt_batch_usage", st == 200 and r["usage"]["prompt_tokens"] == na + nb and
          r["usage"]["completion_tokens"] == 12, r.get("usage"))
    st, ev, done = s.stream("/v1/completions", dict(base, prompt=[a, b], n=2, stream=True))
    streamed = ["".join(e["choices"][0]["text"] for e in ev if e.get("choices") and e["choices"][0]["index"] == i)
                for i in range(4)]
    check("prompt_batch_stream", st == 200 and done and streamed == [c["text"] for c in ch], (streamed, ch))
    ids = [s.json("/tokenize", {"prompt": x})[2]["tokens"] for x in (a, b)]
    st, _, r = s.json("/v1/completions", {"prompt": ids, "echo": True, "max_tokens": 0, "logprobs": 1, "temperature": 0,
                                          "seed": 1234, "return_tokens_as_token_ids": True})
    ch = sorted(r.get("choices", []), key=lambda c: c["index"]) if st == 200 else []
    check("prompt_batch_scored", st == 200 and len(ch) == 2 and
          all(c["logprobs"]["tokens"] == ["token_id:%d" % t for t in ids[i]] and c["logprobs"]["token_logprobs"][0] is None
              and all(x is not None and x <= 0 for x in c["logprobs"]["token_logprobs"][1:]) and
              c["finish_reason"] == "length" for i, c in enumerate(ch)) and
          r["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1]) and r["usage"]["completion_tokens"] == 0, r)
    st, _, r = s.json("/v1/completions", {"prompt": ids, "echo": True, "max_tokens": 0, "n": 2})
    want = [s.json("/detokenize", {"tokens": x})[2].get("prompt") for x in ids]
    check("prompt_batch_echo_ids_n2", st == 200 and
          [c["text"] for c in sorted(r["choices"], key=lambda c: c["index"])] == [want[0], want[0], want[1], want[1]],
          (r, want))


def test_prefix_cache(s):
    """A prompt sent again finds its whole blocks cached (usage.prompt_tokens_details.cached_tokens)
    and gives the same greedy text; another cache_salt finds nothing; the counters in /metrics."""
    text = " ".join("word%d" % i for i in range(120))  # ~250 tokens, not sent by any other test
    body = {"prompt": text, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    h0 = s.metric("semflow_prefix_cache_hits_total") or 0
    st, _, a = s.json("/v1/completions", body)
    n = a["usage"]["prompt_tokens"] if st == 200 else 0
    check("prefix_first_nothing_cached", st == 200 and a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, a)
    st, _, b = s.json("/v1/completions", body)
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1
    check("prefix_again_whole_blocks_cached", n > 32 and cached == (n - 1) // 16 * 16, (n, cached))
    check("prefix_again_same_text", st == 200 and b["choices"][0]["text"] == a["choices"][0]["text"], (a, b))
    h1 = s.metric("semflow_prefix_cache_hits_total") or 0
    check("prefix_metrics_hits", h1 - h0 >= cached and s.metric("semflow_prefix_cache_blocks") > 0, (h0, h1))
    # a salt of its own: nothing shared with the unsalted requests, then its own blocks
    got = []
    for _ in range(2):
        st, _, r = s.json("/v1/completions", dict(body, cache_salt="tenant-a-secret"))
        got.append(r["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1)
    check("prefix_salt_isolates", got == [0, cached], got)
    # chat, streamed with usage: the same field in the last chunk
    msgs = [{"role": "system", "content": text}, {"role": "user", "content": "Hi"}]
    cb = {"messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    s.json("/v1/chat/completions", dict(cb, stream=False, stream_options=None))
    st, ev, done = s.stream("/v1/chat/completions", cb)
    u = ev[-1].get("usage") if ev else None
    check("prefix_chat_stream_usage", st == 200 and done and u and u["prompt_tokens_details"]["cached_tokens"] >= 240,
          u)
    # a chat's next turn finds the turns before it
    turn = [{"role": "system", "content": " ".join("rule%d" % i for i in range(60))},
            {"role": "user", "content": "Tell me a story about a cat."}]
    st, _, t1 = s.json("/v1/chat/completions", {"messages": turn, "max_tokens": 12, "temperature": 0})
    n1 = t1["usage"]["prompt_tokens"] if st == 200 else 0
    turn += [{"role": "assistant", "content": t1["choices"][0]["message"]["content"] if st == 200 else ""},
             {"role": "user", "content": "And then?"}]
    st, _, t2 = s.json("/v1/chat/completions", {"messages": turn, "max_tokens": 4, "temperature": 0})
    c2 = t2["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1
    check("prefix_chat_next_turn", n1 > 100 and c2 >= n1 // 16 * 16 - 16, (n1, c2))
    # n choices: the first computes the prompt, the others find it cached
    fresh = " ".join("choice%d" % i for i in range(100))
    h0 = s.metric("semflow_prefix_cache_hits_total") or 0
    st, _, r = s.json("/v1/completions", {"prompt": fresh, "n": 4, "max_tokens": 4, "temperature": 1.0, "seed": 5})
    n4 = r["usage"]["prompt_tokens"] if st == 200 else 0
    h1 = s.metric("semflow_prefix_cache_hits_total") or 0
    check("prefix_n_choices_share", st == 200 and len(r["choices"]) == 4 and h1 - h0 >= 3 * ((n4 - 1) // 16 * 16),
          (st, n4, h1 - h0))
    # a batch of prompts: each prompt's cached tokens once
    st, _, r = s.json("/v1/completions", dict(body, prompt=[text, text + " more"], n=2))
    c2 = r["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1
    check("prefix_batch_usage_per_prompt", c2 >= 2 * cached, (c2, cached))
    for bad in ("", 5, "x" * 257, ["a"]):
        st, _, r = s.json("/v1/completions", dict(body, cache_salt=bad))
        check("prefix_bad_salt_400_%s" % type(bad).__name__ + ("_empty" if bad == "" else ""),
              st == 400 and r["error"]["param"] == "cache_salt", (st, r))


def test_truncate(s):
    """vLLM's truncate_prompt_tokens: the prompt's last k tokens; -1: as many as the context holds."""
    text = " ".join("item%d" % i for i in range(100))
    st, _, whole = s.json("/tokenize", {"prompt": text})
    toks = whole.get("tokens", [])
    st, _, r = s.json("/v1/completions", {"prompt": text, "max_tokens": 0, "echo": True, "truncate_prompt_tokens": 40})
    st2, _, d = s.json("/detokenize", {"tokens": toks[-40:]})
    check("truncate_keeps_last_tokens", st == 200 and r["usage"]["prompt_tokens"] == 40 and
          r["choices"][0]["text"] == d.get("prompt"), (st, r.get("usage"), r.get("choices", [{}])[0].get("text", "")[:80]))
    st, _, r = s.json("/v1/completions", {"prompt": text, "max_tokens": 2, "truncate_prompt_tokens": 10 ** 5})
    check("truncate_longer_than_prompt_keeps_all", st == 200 and r["usage"]["prompt_tokens"] == len(toks), r.get("usage"))
    big = " ".join("w%d" % i for i in range(1500))  # over the test server's 2048-token context
    st, _, r = s.json("/v1/completions", {"prompt": big, "truncate_prompt_tokens": -1})
    check("truncate_minus_one_fits_the_context", st == 200 and r["usage"]["prompt_tokens"] == 2047 and
          r["usage"]["completion_tokens"] == 1, (st, r.get("usage"), r.get("error")))
    st, _, r = s.json("/v1/chat/completions", {"messages": [{"role": "user", "content": big}], "max_tokens": 3,
                                               "truncate_prompt_tokens": 100})
    check("truncate_chat", st == 200 and r["usage"]["prompt_tokens"] == 100, (st, r.get("usage")))
    for bad in (0, -2, "5", 1.5):
        st, _, r = s.json("/v1/completions", {"prompt": "hi", "truncate_prompt_tokens": bad})
        check("truncate_bad_%r_400" % (bad,), st == 400 and r["error"]["param"] == "truncate_prompt_tokens", (st, r))


def test_guided_choice(s):
    """vLLM's guided_choice (and structured_outputs.choice): every output that ends is one of the
    strings, on both routes and with n; the refusals."""
    opts = ["positive", "negative", "neutral", "yes, definitely"]
    outs, ok = [], True
    for route, extra in (("/v1/completions", {"prompt": "The review was"}),
                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Sentiment?"}]})):
        st, _, r = s.json(route, dict(extra, guided_choice=opts, n=4, temperature=1.0, seed=3, max_tokens=40))
        for c in r.get("choices", []):
            text = c["text"] if "text" in c else c["message"]["content"]
            outs.append(text)
            ok &= st == 200 and c["finish_reason"] == "stop" and text in opts
        ok &= st == 200 and len(r.get("choices", [])) == 4
    check("guided_choice_outputs_are_choices", ok, outs)
    st, _, r = s.json("/v1/completions", {"prompt": "x", "structured_outputs": {"choice": ["A", "B"]}, "max_tokens": 9,
                                          "temperature": 0})
    check("structured_outputs_choice", st == 200 and r["choices"][0]["text"] in ("A", "B"), r)
    st, ev, done = s.stream("/v1/completions", {"prompt": "x", "guided_choice": ["alpha beta", "gamma"], "stream": True,
                                                "max_tokens": 20, "seed": 1})
    text = "".join(e["choices"][0].get("text", "") for e in ev if e.get("choices"))
    check("guided_choice_streamed", st == 200 and done and text in ("alpha beta", "gamma"), (st, text))
    bad = [({"guided_choice": []}, "guided_choice"), ({"guided_choice": ["a", "a"]}, "guided_choice"),
           ({"guided_choice": "a"}, "guided_choice"), ({"guided_choice": ["a", 1]}, "guided_choice"),
           ({"guided_choice": ["a"], "guided_json": {"type": "object"}}, "guided_choice"),
           ({"guided_choice": ["a"], "ignore_eos": True}, "ignore_eos"),
           ({"structured_outputs": {"lark": "start: 'a'"}}, "structured_outputs"),
           ({"allowed_token_ids": [5, 6]}, "allowed_token_ids"), ({"bad_words": ["x"]}, "bad_words"),
           ({"logits_processors": ["m.f"]}, "logits_processors")]
    for i, (body, param) in enumerate(bad):
        st, _, r = s.json("/v1/completions", dict(body, prompt="x", max_tokens=4))
        check("guided_refused_%d_%s" % (i, "_".join(sorted(body))), st == 400 and r["error"]["param"] == param,
              (body, st, r))
    st, _, r = s.json("/v1/chat/completions", {"messages": [{"role": "user", "content": "w"}], "guided_choice": ["a"],
                                               "tools": [{"type": "function", "function": {"name": "f"}}],
                                               "tool_choice": "required"})
    check("guided_choice_with_forced_call_400", st == 400 and r["error"]["param"] == "tool_choice", r)


def test_guided_regex(s):
    """vLLM's guided_regex (and structured_outputs.regex): every output that ends with "stop" is a
    whole match of the pattern (Python's re.fullmatch), on both routes, with n, streamed and with
    logprobs; a pattern no token can continue ends in an error that says so; the refusals."""
    pats = [r"\d{3}-\d{4}", r"(yes|no), because [a-z ]{1,12}\.", r"[a-z]{1,6}@[a-z]{1,6}\.(com|org)",
            r"(?P<h>[01]\d|2[0-3]):[0-5]\d"]
    outs, ok = [], True
    for pat in pats:
        for route, extra in (("/v1/completions", {"prompt": "The answer is"}),
                             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Answer?"}]})):
            st, _, r = s.json(route, dict(extra, guided_regex=pat, n=3, temperature=1.0, seed=5, max_tokens=60))
            for c in r.get("choices", []):
                text = c["text"] if "text" in c else c["message"]["content"]
                outs.append((pat, text))
                ok &= st == 200 and c["finish_reason"] == "stop" and re.fullmatch(pat, text) is not None
            ok &= st == 200 and len(r.get("choices", [])) == 3
    check("guided_regex_outputs_match", ok, outs)
    body = {"prompt": "x", "structured_outputs": {"regex": r"[A-C]{2}"}, "max_tokens": 9, "temperature": 0,
            "logprobs": 2}
    st, _, r = s.json("/v1/completions", body)
    c = r.get("choices", [{}])[0]
    check("structured_outputs_regex", st == 200 and re.fullmatch(r"[A-C]{2}", c.get("text", "")) is not None and
          "".join(c["logprobs"]["tokens"]) == c["text"], r)
    pat = r"(alpha|beta) [0-9]{2,4}"
    body = {"prompt": "x", "guided_regex": pat, "max_tokens": 30, "seed": 9, "temperature": 1.0}
    st1, _, whole = s.json("/v1/completions", body)
    st, ev, done = s.stream("/v1/completions", dict(body, stream=True))
    text = "".join(e["choices"][0].get("text", "") for e in ev if e.get("choices"))
    check("guided_regex_streamed", st == 200 and done and re.fullmatch(pat, text) is not None and
          text == whole["choices"][0]["text"], (st, text, whole))
    # JSON Schema's pattern on a string: a search (ECMA-262), on both routes
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
                                               "ok": {"type": "boolean"}}, "required": ["code", "ok"],
              "additionalProperties": False}
    outs, ok = [], True
    for route, extra in (("/v1/completions", {"prompt": "A record:"}),
                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "A record?"}]})):
        st, _, r = s.json(route, dict(extra, n=3, temperature=1.0, seed=2, max_tokens=200,
                                      response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}))
        for c in r.get("choices", []):
            text = c["text"] if "text" in c else c["message"]["content"]
            outs.append(text)
            try:
                v = json.loads(text)
            except ValueError:
                v = None
            ok &= st == 200 and c["finish_reason"] == "stop" and isinstance(v, dict) and \
                re.fullmatch(r"[A-Z]{2}-\d{3}", v.get("code", "")) is not None and isinstance(v.get("ok"), bool)
        ok &= st == 200 and len(r.get("choices", [])) == 3
    check("json_schema_pattern_outputs_match", ok, outs)
    st, _, r = s.json("/v1/completions", {"prompt": "x", "guided_json": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)a"}}}})
    check("json_schema_pattern_refused", st == 400 and "'pattern' at $.properties.a" in r["error"]["message"] and
          "lookaround" in r["error"]["message"], r)
    # a character no token of the vocabulary has: an error, not an output that does not match
    st, _, r = s.json("/v1/completions", {"prompt": "x", "guided_regex": "\u00ff\u00fe", "max_tokens": 5})
    check("guided_regex_no_token_fits", st == 400 and r["error"]["code"] == "no_token_fits" and
          "pattern or grammar" in r["error"]["message"], (st, r))
    st, ev, done = s.stream("/v1/completions", {"prompt": "x", "guided_regex": "\\u00ff\\u00fe", "max_tokens": 5,
                                                "stream": True})
    errs = [e["error"] for e in ev if "error" in e]
    check("guided_regex_no_token_fits_streamed", st == 200 and done and len(errs) == 1 and
          errs[0]["type"] == "invalid_request_error" and errs[0]["code"] == "no_token_fits", (st, ev))
    bad = [({"guided_regex": "(a"}, "guided_regex", "without its ')'"),
           ({"guided_regex": "a(?=b)"}, "guided_regex", "lookaround"),
           ({"guided_regex": r"(a)\1"}, "guided_regex", "back-references"),
           ({"guided_regex": 5}, "guided_regex", "string"),
           ({"guided_regex": "(a|b)*a(a|b){14}"}, "guided_regex", "automaton states"),
           ({"structured_outputs": {"regex": "[z-a]"}}, "structured_outputs.regex", "before its start"),
           ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex", "give one of"),
           ({"guided_regex": "a", "structured_outputs": {"regex": "a"}}, "structured_outputs", "not both"),
           ({"guided_regex": "a+", "ignore_eos": True}, "ignore_eos", "guided_regex"),
           ({"guided_regex": "a+", "min_tokens": 2}, "min_tokens", "guided_regex")]
    for i, (body, param, words) in enumerate(bad):
        st, _, r = s.json("/v1/completions", dict(body, prompt="x", max_tokens=4))
        check("guided_regex_refused_%d" % i, st == 400 and r["error"]["param"] == param and
              words in r["error"]["message"], (body, st, r))
    st, _, r = s.json("/v1/chat/completions", {"messages": [{"role": "user", "content": "w"}], "guided_regex": "a",
                                               "tools": [{"type": "function", "function": {"name": "f"}}],
                                               "tool_choice": "required"})
    check("guided_regex_with_forced_call_400", st == 400 and r["error"]["param"] == "tool_choice" and
          "guided_regex" in r["error"]["message"], r)


def test_guided_grammar(s):
    """A GBNF grammar (llama.cpp's `grammar`, vLLM's guided_grammar and structured_outputs.grammar):
    every output that ends with "stop" is in its language (checked with the regular expression
    written here by hand for it), on both routes, with n and streamed; the refusals."""
    g = ('# an answer with its confidence\n'
         'root ::= answer ", " conf "%"\n'
         'answer ::= ("yes" | "no" | "maybe") (" (" [a-z]{2,8} ")")?\n'
         'conf ::= [1-9]? [0-9] | "100"\n')
    rx = r"(yes|no|maybe)( \([a-z]{2,8}\))?, ([1-9]?[0-9]|100)%"
    outs, ok = [], True
    for key in ("grammar", "guided_grammar"):
        for route, extra in (("/v1/completions", {"prompt": "Is it?"}),
                             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Is it?"}]})):
            st, _, r = s.json(route, dict(extra, n=3, temperature=1.0, seed=7, max_tokens=40, **{key: g}))
            for c in r.get("choices", []):
                text = c["text"] if "text" in c else c["message"]["content"]
                outs.append(text)
                ok &= st == 200 and c["finish_reason"] == "stop" and re.fullmatch(rx, text) is not None
            ok &= st == 200 and len(r.get("choices", [])) == 3
    check("grammar_outputs_in_language", ok, outs)
    body = {"prompt": "x", "structured_outputs": {"grammar": g}, "max_tokens": 40, "seed": 3, "temperature": 1.0}
    st, _, whole = s.json("/v1/completions", body)
    st2, ev, done = s.stream("/v1/completions", dict(body, stream=True))
    text = "".join(e["choices"][0].get("text", "") for e in ev if e.get("choices"))
    check("structured_outputs_grammar_streamed", st == 200 and st2 == 200 and done and re.fullmatch(rx, text) is not None and
          text == whole["choices"][0]["text"], (st, st2, text, whole))
    st, _, r = s.json("/v1/completions", {"prompt": "x", "grammar": "", "max_tokens": 2})
    check("grammar_empty_is_none", st == 200, r)  # llama.cpp's server sends "" for no grammar
    bad = [({"grammar": "root ::= \"(\" root \")\" | \"x\""}, "grammar", "refers back to itself"),
           ({"guided_grammar": "root ::= a"}, "guided_grammar", "rule 'a' is not defined"),
           ({"grammar": "answer ::= \"a\""}, "grammar", "no rule 'root'"),
           ({"grammar": "root ::= \"a"}, "grammar", "line 1, column 10"),
           ({"grammar": 5}, "grammar", "a GBNF grammar"),
           ({"grammar": "root ::= \"a\"", "guided_grammar": "root ::= \"a\""}, "grammar", "not both"),
           ({"grammar": "root ::= \"a\"", "guided_regex": "a"}, "grammar", "give one of"),
           ({"structured_outputs": {"grammar": "root ::= [z-a]"}}, "structured_outputs.grammar", "before its start"),
           ({"grammar": "root ::= (\"a\" | \"b\")* \"a\" (\"a\" | \"b\"){14}"}, "grammar", "written out as one pattern"),
           ({"grammar": "root ::= \"a\"", "min_tokens": 3}, "min_tokens", "'grammar'")]
    for i, (body, param, words) in enumerate(bad):
        st, _, r = s.json("/v1/completions", dict(body, prompt="x", max_tokens=4))
        check("grammar_refused_%d" % i, st == 400 and r["error"]["param"] == param and words in r["error"]["message"],
              (body, st, r))


def test_continue_final(s):
    """vLLM's continue_final_message: the chat's last (assistant) message is left open and the
    model goes on writing it; /tokenize renders the same prompt, and a completion from those
    tokens gives the chat's greedy text; the refusals."""
    msgs = [{"role": "user", "content": "Tell a story."}, {"role": "assistant", "content": "Once upon a"}]
    cont = {"messages": msgs, "continue_final_message": True, "add_generation_prompt": False}
    st, _, tok = s.json("/tokenize", cont)
    st2, _, text = s.json("/detokenize", {"tokens": tok.get("tokens", [])})
    check("continue_final_prompt_ends_open", st == 200 and st2 == 200 and text.get("prompt", "").endswith("Once upon a"),
          (st, st2, text))
    st, _, r = s.json("/v1/chat/completions", dict(cont, temperature=0, max_tokens=12))
    st2, _, r2 = s.json("/v1/completions", {"prompt": tok.get("tokens", []), "temperature": 0, "max_tokens": 12})
    chat = r.get("choices", [{}])[0].get("message", {}).get("content")
    check("continue_final_equals_completion", st == 200 and st2 == 200 and chat == r2["choices"][0]["text"] and
          r["usage"]["prompt_tokens"] == tok["count"], (chat, r2.get("choices"), r.get("usage"), tok.get("count")))
    for i, (body, words) in enumerate(((dict(cont, add_generation_prompt=True), "add_generation_prompt"),
                                       ({"messages": msgs, "continue_final_message": True}, "add_generation_prompt"),
                                       (dict(cont, messages=[msgs[0], {"role": "assistant", "content": ""}]), "empty"),
                                       (dict(cont, continue_final_message="yes"), "true or false"))):
        st, _, r = s.json("/v1/chat/completions", dict(body, max_tokens=2))
        check("continue_final_refused_%d" % i, st == 400 and r["error"]["param"] == "continue_final_message" and
              words in r["error"]["message"], (body, st, r))


def test_bad_inputs(s, model):
    big = "hello " * 3000
    cases = [
        # (name, method, path, body, headers, status)
        ("malformed_json", "POST", "/v1/completions", b'{"prompt": "x",', None, 400),
        ("invalid_utf8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe bad"}', None, 400),
        ("lone_surrogate", "POST", "/v1/completions", b'{"prompt": "\\ud800"}', None, 400),
        ("nul_in_string", "POST", "/v1/completions", b'{"prompt": "a\\u0000b"}', None, 400),
        ("duplicate_keys", "POST", "/v1/completions", b'{"prompt": "a", "prompt": "b"}', None, 400),
        ("empty_body", "POST", "/v1/completions", b"", None, 400),
        ("body_not_object", "POST", "/v1/completions", b"[1, 2]", None, 400),
        ("prompt_missing", "POST", "/v1/completions", {"max_tokens": 3}, None, 400),
        ("prompt_wrong_type", "POST", "/v1/completions", {"prompt": {"a": 1}}, None, 400),
        ("prompts_too_many", "POST", "/v1/completions", {"prompt": ["a"] * 300}, None, 400),
        ("prompts_times_n_too_many", "POST", "/v1/completions", {"prompt": ["a"] * 100, "n": 16}, None, 400),
        ("prompts_bad_token_id", "POST", "/v1/completions", {"prompt": [[1, 2], [3, 99999999]]}, None, 400),
        ("prompts_empty_ids", "POST", "/v1/completions", {"prompt": [[1, 2], []]}, None, 400),
        ("tokenize_two_prompts", "POST", "/tokenize", {"prompt": ["a", "b"]}, None, 400),
        ("prompt_bad_token_id", "POST", "/v1/completions", {"prompt": [1, 99999999]}, None, 400),
        ("max_tokens_string", "POST", "/v1/completions", {"prompt": "a", "max_tokens": "5"}, None, 400),
        ("max_tokens_negative", "POST", "/v1/completions", {"prompt": "a", "max_tokens": -1}, None, 400),
        ("max_tokens_zero", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 0}, None, 400),
        ("max_tokens_huge", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 10 ** 12}, None, 400),
        ("max_tokens_over_context", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 100000}, None, 400),
        ("prompt_longer_than_context", "POST", "/v1/completions", {"prompt": big, "max_tokens": 1}, None, 400),
        ("temperature_wrong_type", "POST", "/v1/completions", {"prompt": "a", "temperature": "hot"}, None, 400),
        ("temperature_negative", "POST", "/v1/completions", {"prompt": "a", "temperature": -0.5}, None, 400),
        ("top_p_above_1", "POST", "/v1/completions", {"prompt": "a", "top_p": 1.5}, None, 400),
        ("top_p_zero", "POST", "/v1/completions", {"prompt": "a", "top_p": 0}, None, 400),
        ("top_k_below_minus1", "POST", "/v1/completions", {"prompt": "a", "top_k": -2}, None, 400),
        ("min_p_above_1", "POST", "/v1/completions", {"prompt": "a", "min_p": 2}, None, 400),
        ("presence_penalty_range", "POST", "/v1/completions", {"prompt": "a", "presence_penalty": 3}, None, 400),
        ("seed_float", "POST", "/v1/completions", {"prompt": "a", "seed": 1.5}, None, 400),
        ("n_zero", "POST", "/v1/completions", {"prompt": "a", "n": 0}, None, 400),
        ("n_too_many", "POST", "/v1/completions", {"prompt": "a", "n": 1000}, None, 400),
        ("stop_wrong_type", "POST", "/v1/completions", {"prompt": "a", "stop": 5}, None, 400),
        ("stop_too_many", "POST", "/v1/completions", {"prompt": "a", "stop": ["x"] * 20}, None, 400),
        ("stream_wrong_type", "POST", "/v1/completions", {"prompt": "a", "stream": "yes"}, None, 400),
        ("stream_options_without_stream", "POST", "/v1/completions",
         {"prompt": "a", "stream_options": {"include_usage": True}}, None, 400),
        ("completions_logprobs_range", "POST", "/v1/completions", {"prompt": "a", "logprobs": 50}, None, 400),
        ("prompt_logprobs_range", "POST", "/v1/completions", {"prompt": "a", "prompt_logprobs": 21}, None, 400),
        ("prompt_logprobs_wrong_type", "POST", "/v1/completions", {"prompt": "a", "prompt_logprobs": True}, None, 400),
        ("echo_in_chat", "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True},
         None, 400),
        ("echo_wrong_type", "POST", "/v1/completions", {"prompt": "a", "echo": "yes"}, None, 400),
        ("echo_prompt_only_min_tokens", "POST", "/v1/completions",
         {"prompt": "a", "echo": True, "max_tokens": 0, "min_tokens": 1}, None, 400),
        ("messages_missing", "POST", "/v1/chat/completions", {"max_tokens": 3}, None, 400),
        ("messages_not_array", "POST", "/v1/chat/completions", {"messages": "hi"}, None, 400),
        ("message_bad_role", "POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, None, 400),
        ("message_no_role", "POST", "/v1/chat/completions", {"messages": [{"content": "x"}]}, None, 400),
        ("top_logprobs_without_logprobs", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, None, 400),
        ("tool_without_function", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, None, 400),
        ("logit_bias_not_object", "POST", "/v1/completions", {"prompt": "a", "logit_bias": [[5, 10]]}, None, 400),
        ("logit_bias_key_not_id", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"hello": 10}}, None, 400),
        ("logit_bias_key_negative", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"-5": 10}}, None, 400),
        ("logit_bias_out_of_range", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"5": 101}}, None, 400),
        ("logit_bias_not_number", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"5": "10"}}, None, 400),
        ("logit_bias_id_past_vocab", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"99999999": 1}}, None, 400),
        ("logit_bias_same_id_twice", "POST", "/v1/completions", {"prompt": "a", "logit_bias": {"5": 1, "05": 2}}, None,
         400),
        ("min_tokens_over_max_tokens", "POST", "/v1/completions", {"prompt": "a", "max_tokens": 4, "min_tokens": 5},
         None, 400),
        ("skip_special_tokens_not_bool", "POST", "/v1/completions", {"prompt": "a", "skip_special_tokens": "no"}, None,
         400),
        ("include_stop_str_not_bool", "POST", "/v1/completions", {"prompt": "a", "include_stop_str_in_output": 1},
         None, 400),
        ("min_tokens_negative", "POST", "/v1/completions", {"prompt": "a", "min_tokens": -1}, None, 400),
        ("stop_token_ids_not_array", "POST", "/v1/completions", {"prompt": "a", "stop_token_ids": 5}, None, 400),
        ("stop_token_ids_negative", "POST", "/v1/completions", {"prompt": "a", "stop_token_ids": [-1]}, None, 400),
        ("stop_token_ids_too_many", "POST", "/v1/completions", {"prompt": "a", "stop_token_ids": list(range(9))}, None,
         400),
        ("stop_token_ids_past_vocab", "POST", "/v1/completions", {"prompt": "a", "stop_token_ids": [99999999]}, None,
         400),
        ("logit_bias_too_many", "POST", "/v1/completions",
         {"prompt": "a", "logit_bias": {str(i): 1 for i in range(1025)}}, None, 400),
        ("intent_header_empty_param", "POST", "/v1/completions", {"prompt": "a"}, {"X-Semantic-Intent": "chat;;"}, 400),
        ("intent_header_bad_urgency", "POST", "/v1/completions", {"prompt": "a"},
         {"X-Semantic-Intent": "chat; urgency=asap"}, 400),
        ("intent_header_no_unit", "POST", "/v1/completions", {"prompt": "a"},
         {"X-Semantic-Intent": "chat; max-latency=400"}, 400),
        ("intent_field_wrong_type", "POST", "/v1/completions", {"prompt": "a", "intent": 5}, None, 400),
        ("unknown_model", "POST", "/v1/completions", {"prompt": "a", "model": "gpt-17"}, None, 404),
        ("unknown_route", "GET", "/v2/everything", None, None, 404),
        ("wrong_method_post_route", "GET", "/v1/completions", None, None, 405),
        ("wrong_method_get_route", "DELETE", "/v1/models", None, None, 405),
        ("oversized_body", "POST", "/v1/completions", b'{"prompt": "' + b"a" * 70000 + b'"}', None, 413),
        ("detokenize_bad_id", "POST", "/detokenize", {"tokens": [-1]}, None, 400),
    ]
    for name, method, path, body, headers, want in cases:
        try:
            st, h, data = s.request(method, path, body, headers)
        except OSError as e:
            check("bad_input_" + name, False, "request failed: %s" % e)
            continue
        shape = False
        try:
            err = json.loads(data)["error"]
            shape = isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str) and \
                "param" in err and "code" in err
        except (ValueError, KeyError, TypeError):
            pass
        extra = True
        if want == 405:
            extra = bool(h.get("allow"))
        check("bad_input_" + name, st == want and shape and extra and s.alive(),
              "status %d (want %d), body %r" % (st, want, data[:160]))

    # transport-level rejections (before a request exists; evhttp answers these itself)
    def raw(data):
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may answer and close before reading everything; read what it said
        out = b""
        try:
            while True:
                d = sock.recv(65536)
                if not d:
                    break
                out += d
                if b"\r\n\r\n" in out:
                    break
        except OSError:
            pass
        sock.close()
        return out

    out = raw(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
    check("bad_input_oversized_headers", out.split(b" ")[1:2] in ([b"400"], [b"431"], [b"413"]) and s.alive(), out[:80])
    # the declared length alone is refused: send the headers and a little of the body
    out = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n" + b"x" * 1000)
    check("bad_input_far_oversized_body", out.split(b" ")[1:2] == [b"413"] and s.alive(), out[:80])
    out = raw(b"NONSENSE\r\n\r\n")
    check("bad_input_garbage_request_line", out.split(b" ")[1:2] == [b"400"] and s.alive(), out[:80])


def test_half_open(s):
    socks = []
    for i in range(300):
        c = socket.create_connection(("127.0.0.1", s.port))
        if i % 2:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"prompt\"")
        socks.append(c)
    t0 = time.time()
    st, _, r = s.json("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    dt = time.time() - t0
    check("half_open_connections_do_not_block", st == 200 and dt < 10, "status %d after %.1f s" % (st, dt))
    for c in socks:
        c.close()


def test_disconnect_frees_kv(s):
    # long (2000 tokens) so that it is still running when the client goes away, however fast the engine
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True})
    sock = socket.create_connection(("127.0.0.1", s.port))
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    got = b""
    while got.count(b"data: ") < 3:
        d = sock.recv(4096)
        if not d:
            break
        got += d
    used_during = s.metric("semflow_kv_blocks_used")
    sock.close()
    used = None
    for _ in range(100):
        used = s.metric("semflow_kv_blocks_used")
        if used == 0:
            break
        time.sleep(0.05)
    check("disconnect_mid_stream_frees_kv", used_during and used_during > 0 and used == 0 and
          s.metric("semflow_client_disconnects_total") >= 1, "KV used during %s, after %s" % (used_during, used))


def test_port_taken(s):
    """A second server on a port the first listens on is refused (SO_REUSEPORT would have let it
    share the connections, silently); after the first stops, one starts there at once, its
    closed connections in TIME_WAIT notwithstanding."""
    p = subprocess.run([BIN, "serve", "--model", "demo", "--host", "127.0.0.1", "--port", str(s.port)],
                       capture_output=True, text=True, timeout=60)
    check("second_server_same_port_refused", p.returncode == 1 and "another process listens there" in p.stderr,
          (p.returncode, p.stderr[-300:]))


def test_port_reuse_after_stop(port):
    try:
        s = ServerProcess(["--model", "demo"], port=port)
    except RuntimeError as e:  # it did not start
        check("restart_on_same_port", False, e)
        return
    check("restart_on_same_port", s.stop() == 0, s.logtext())


def test_speculative():
    """A server with n-gram speculative decoding gives the greedy text `semflow generate` gives
    without it, and counts its drafts in /metrics; a bad --speculative-config stops it at start."""
    s = Server("--workers", "1", "--max-model-len", "2048", "--speculative-config",
               '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}')
    try:
        prompt = "one two three four one two three four one two three four one two"
        st, _, r = s.json("/v1/completions", {"prompt": prompt, "max_tokens": 48, "temperature": 0})
        rc, cli = generate_cli(prompt, 48)
        check("spec_server_equals_generate", st == 200 and rc == 0 and r["choices"][0]["text"] == cli.rstrip("\n"),
              (r.get("choices", [{}])[0].get("text"), cli))
        drafts = s.metric("semflow_spec_decode_num_draft_tokens_total") or 0
        acc = s.metric("semflow_spec_decode_num_accepted_tokens_total")
        check("spec_metrics", drafts > 0 and acc is not None and acc <= drafts, (drafts, acc))
    finally:
        check("spec_server_exit_0", s.stop() == 0, s.logtext())
    for bad in ('{"method": "eagle", "num_speculative_tokens": 2}', '{"method": "ngram"}', "nope",
                '{"method": "ngram", "num_speculative_tokens": 99}', '{"method": "ngram", "num_speculative_tokens": 2, "x": 1}'):
        p = subprocess.run([BIN, "serve", "--model", "demo", "--port", "0", "--speculative-config", bad],
                           capture_output=True, timeout=120)
        check("spec_bad_config_refused_%d" % len(bad), p.returncode != 0 and b"speculative" in p.stderr, p.stderr[-300:])


def main():
    if not os.path.exists(BIN):
        print("FAIL: test_server: %s not built" % BIN)
        return 1
    s = Server("--workers", "2", "--max-model-len", "2048", "--max-body", "65536")
    try:
        check("health_ready", s.alive())
        model = test_api(s)
        test_json_mode(s)
        test_tools(s)
        test_prompt_logprobs(s)
        test_prompt_batch(s)
        test_prefix_cache(s)
        test_truncate(s)
        test_guided_choice(s)
        test_guided_regex(s)
        test_guided_grammar(s)
        test_continue_final(s)
        test_bad_inputs(s, model)
        test_half_open(s)
        test_disconnect_frees_kv(s)
        test_port_taken(s)
        check("server_still_serving", s.alive(), s.logtext())
    finally:
        rc = s.stop()
        check("sigterm_exit_0", rc == 0, "exit %s: %s" % (rc, s.logtext()))
    test_port_reuse_after_stop(s.port)
    test_speculative()
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
