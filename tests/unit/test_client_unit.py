"""ignis_client against a tiny fake daemon written here (an asyncio Unix-socket NDJSON peer with hand-written reply
shapes), the `ignis` command, and the no-torch rule of the control plane."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import pytest

from ignis_client import AsyncClient, Client, DaemonNotRunning, IgnisError, ReplyTimeout
from ignis_client import cli

USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}


def done(rid, text, finish="stop"):
    return {"id": rid, "type": "done", "text": text, "finish_reason": finish, "usage": USAGE,
            "timings": {"queue_ms": 0, "load_ms": 0, "ttft_ms": 1, "prefill_tokens_per_s": 0, "decode_tokens_per_s": 0},
            "ignis": {"reuse": {"tier": None, "kind": None, "cached_tokens": 0, "reason": "miss",
                                "best_candidate": None, "diverged_at": None}},
            "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}}


class FakeDaemon:
    """NDJSON peer. chat behaviour by the last message's content: "fail" → error reply; "auth" → an auth error;
    "slow" → answers after 0.3 s; "garble" → an error with id null; "forever" → deltas until cancelled; "finish=R" →
    "Hel" + "lo" ending with finish_reason R; else "Hel" + "lo"."""

    def __init__(self, path: str):
        self.path, self.requests, self.cancelled, self.writers = path, [], set(), set()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_unix_server(self._conn, self.path))
        self.ready.set()
        self.loop.run_forever()

    def start(self):
        self.thread.start()
        self.ready.wait(5)
        return self

    def stop(self):
        async def shut():
            self.server.close()
            for w in list(self.writers):
                w.close()
            await self.server.wait_closed()
        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _conn(self, reader, writer):
        def send(obj):
            writer.write(json.dumps(obj).encode() + b"\n")
        tasks = set()
        self.writers.add(writer)
        while line := await reader.readline():
            req = json.loads(line)
            self.requests.append(req)
            t = asyncio.ensure_future(self._handle(req, send))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        self.writers.discard(writer)
        writer.close()

    async def _handle(self, req, send):
        rid, op = req["id"], req["op"]
        if op == "health":
            send({"id": rid, "type": "result", "result": {"ok": True, "model": "fake"}})
        elif op == "status":
            send({"id": rid, "type": "result", "result": {"queue": {"waiting": 0}, "lanes": {"total": 8}}})
        elif op == "metrics":
            send({"id": rid, "type": "result", "result": {"text": "# TYPE ignis_lanes_busy gauge\nignis_lanes_busy 0.0\n"}})  # noqa: E501
        elif op == "cancel":
            self.cancelled.add(req["target"])
            send({"id": rid, "type": "result", "result": {"cancelled": True}})
        elif op in ("tokenize", "detokenize", "reset"):
            send({"id": rid, "type": "result", "result": {"echo": req}})
        elif op in ("chat", "completion"):
            what = req["messages"][-1]["content"] if op == "chat" else req["prompt"]
            if what == "fail":
                send({"id": rid, "type": "error", "error": {"code": "bad_request", "message": "messages[0].role: no",
                                                            "field": "messages[0].role"}})
                return
            if what == "auth":
                send({"id": rid, "type": "error", "error": {"code": "auth", "message": "missing or wrong api_key",
                                                            "field": "api_key"}})
                return
            if what == "garble":
                send({"id": None, "type": "error", "error": {"code": "bad_json", "message": "invalid JSON",
                                                             "field": None}})
                return
            if what == "slow":
                await asyncio.sleep(0.3)
            if what == "forever":
                while rid not in self.cancelled:
                    send({"id": rid, "type": "delta", "text": "x"})
                    await asyncio.sleep(0.01)
                send(done(rid, "x", "cancelled"))
                return
            finish = what[len("finish="):] if str(what).startswith("finish=") else "stop"
            text = f"Hello {what}" if what not in ("hi", "slow") and finish == "stop" else "Hello"
            if req.get("stream"):
                send({"id": rid, "type": "delta", "text": text[:3]})
                await asyncio.sleep(0.01)
                send({"id": rid, "type": "delta", "text": text[3:]})
            send(done(rid, text, finish))


@pytest.fixture
def daemon():
    d = tempfile.mkdtemp(prefix="ig")          # short: AF_UNIX paths are limited to 107 bytes
    fake = FakeDaemon(os.path.join(d, "s.sock")).start()
    yield fake
    fake.stop()
    shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ sync client

def test_sync_chat_and_ops(daemon):
    with Client(daemon.path, timeout=5) as c:
        reply = c.chat("hi", temperature=0, max_tokens=8)
        assert reply["type"] == "done" and reply["text"] == "Hello" and reply["usage"] == USAGE
        assert c.health() == {"ok": True, "model": "fake"}
        assert c.status()["lanes"] == {"total": 8}
        assert c.metrics()["text"].startswith("# TYPE")
        assert c.cancel("zz") == {"cancelled": True}
        assert c.tokenize(text="abc")["echo"]["text"] == "abc"
        assert c.detokenize([1, 2])["echo"]["tokens"] == [1, 2]
        assert c.reset()["echo"]["op"] == "reset"
        assert c.completion([1, 2, 3], max_tokens=2)["text"] == "Hello [1, 2, 3]"
    first = daemon.requests[0]
    assert first["op"] == "chat" and first["messages"] == [{"role": "user", "content": "hi"}]
    assert first["stream"] is False and first["temperature"] == 0 and first["max_tokens"] == 8
    ids = [r["id"] for r in daemon.requests]
    assert len(set(ids)) == len(ids) and all(1 <= len(i) <= 128 for i in ids)
    assert all("api_key" not in r for r in daemon.requests)


def test_sync_stream(daemon):
    with Client(daemon.path, timeout=5) as c:
        events = list(c.chat([{"role": "user", "content": "hi"}], stream=True))
    assert [e["type"] for e in events] == ["delta", "delta", "done"]
    assert "".join(e["text"] for e in events[:-1]) == events[-1]["text"] == "Hello"
    assert daemon.requests[0]["stream"] is True


def test_sync_error_reply_raises(daemon):
    with Client(daemon.path, timeout=5) as c:
        with pytest.raises(IgnisError) as ei:
            c.chat("fail")
        assert (ei.value.code, ei.value.field) == ("bad_request", "messages[0].role")
        assert c.health()["ok"]                    # the connection is still usable


def test_sync_unparsed_line_error_goes_to_the_waiting_request(daemon):
    with Client(daemon.path, timeout=5) as c:
        with pytest.raises(IgnisError) as ei:
            c.chat("garble")
        assert ei.value.code == "bad_json"


def test_sync_closing_a_stream_early_cancels_it(daemon):
    with Client(daemon.path, timeout=5) as c:
        events = c.chat("forever", stream=True)
        assert next(events)["type"] == "delta"
        rid = daemon.requests[-1]["id"]
        events.close()
        assert c.health()["ok"]                    # leftover events of the cancelled request are dropped
        assert rid in daemon.cancelled
        assert c.chat("hi")["text"] == "Hello"


def test_sync_interleaved_streams(daemon):
    with Client(daemon.path, timeout=5) as c:
        a = c.chat("alpha", stream=True)
        b = c.chat("beta", stream=True)
        got_b = list(b)
        got_a = list(a)
    assert got_a[-1]["text"] == "Hello alpha" and got_b[-1]["text"] == "Hello beta"


def test_api_key_sent_except_for_health(daemon):
    with Client(daemon.path, timeout=5, api_key="sekrit") as c:
        c.health()
        c.status()
    assert "api_key" not in daemon.requests[0] and daemon.requests[1]["api_key"] == "sekrit"


def test_int_token_ids_as_logit_bias_keys_go_out_as_json_strings(daemon):
    """logit_bias={12: -100} (Python's natural spelling; json.dumps writes "12") used to fail in the client with
    orjson's "Dict key must be str" and no field."""
    with Client(daemon.path, timeout=5) as c:
        c.chat("hi", logit_bias={12: -100, "7": 5})
    assert daemon.requests[-1]["logit_bias"] == {"12": -100, "7": 5}


def test_client_refuses_an_oversized_line_itself(daemon):
    with Client(daemon.path, timeout=5, max_line_bytes=1024) as c:
        with pytest.raises(IgnisError) as ei:
            c.chat("x" * 2000)
        assert ei.value.code == "too_long"


def test_client_owned_fields_and_unencodable_text_fail_at_once(daemon):
    """Passing id / op / api_key as a field would re-route the replies (the call used to hang): ValueError naming
    it. A lone surrogate (not UTF-8), NaN (JSON would carry null: the default) or an int past 64 bits: IgnisError
    bad_request naming the field. Nothing is sent, and the connection keeps working."""
    with Client(daemon.path, timeout=5) as c:
        with pytest.raises(ValueError, match=r"^id: set by the client"):
            c.chat("hi", id="mine")
        with pytest.raises(ValueError, match=r"^api_key: "):
            c.request("chat", api_key="k", messages=[])
        with pytest.raises(ValueError, match=r"^op: set by the client"):   # not a TypeError of the method's op
            c.chat("hi", op="status")
        with pytest.raises(ValueError, match=r"^op: "):
            next(iter(c.stream("chat", op="status", messages=[])))
        for call, field in ((lambda: c.chat("bad \ud800 text"), "messages[0].content"),
                            (lambda: c.chat("hi", logit_bias={"\ud800": 1}), "logit_bias"),
                            (lambda: c.chat("hi", logit_bias={(1, 2): 1}), "logit_bias"),
                            (lambda: c.chat("hi", stop={"a"}), "stop"),
                            (lambda: c.chat([{"role": "user", "content": b"hi"}]), "messages[0].content"),
                            (lambda: c.chat("hi", temperature=float("nan")), "temperature"),
                            (lambda: c.chat("hi", max_tokens=2 ** 64), "max_tokens"),
                            (lambda: c.chat([{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]),
                             "messages[0].content[0].text")):
            with pytest.raises(IgnisError) as ei:
                call()
            assert (ei.value.code, ei.value.field) == ("bad_request", field), ei.value
            assert str(ei.value).startswith(field) or field in str(ei.value)
        n = len(daemon.requests)
        assert c.health()["ok"] is True and len(daemon.requests) == n + 1

    async def go():
        async with AsyncClient(daemon.path, timeout=5) as ac:
            with pytest.raises(ValueError):
                await ac.chat("hi", id="mine")
            with pytest.raises(ValueError, match=r"^op: set by the client"):
                await ac.chat("hi", op="status")
            return await ac.health()
    assert asyncio.run(go())["ok"] is True


def test_not_running_names_the_socket(tmp_path):
    path = str(tmp_path / "none.sock")
    with pytest.raises(DaemonNotRunning) as ei:
        Client(path).health()
    assert ei.value.socket_path == path and path in str(ei.value)


def test_default_socket_path_is_resolved(monkeypatch):
    monkeypatch.setenv("IGNIS_SOCKET", "/x/y.sock")
    assert Client().socket_path == "/x/y.sock" and AsyncClient().socket_path == "/x/y.sock"


# ------------------------------------------------------------------ async client

def test_async_demultiplexes_concurrent_requests(daemon):
    async def main():
        async with AsyncClient(daemon.path, timeout=5) as c:
            slow = asyncio.ensure_future(c.chat("slow"))
            await asyncio.sleep(0.05)
            fast = await c.chat("quick")
            assert not slow.done()             # answered out of order on one connection
            events = [e async for e in c.chat("streamed", stream=True)]
            health = await c.health()
            return await slow, fast, events, health
    slow, fast, events, health = asyncio.run(main())
    assert slow["text"] == "Hello" and fast["text"] == "Hello quick"
    assert [e["type"] for e in events] == ["delta", "delta", "done"] and events[-1]["text"] == "Hello streamed"
    assert health == {"ok": True, "model": "fake"}


def test_async_errors_and_stream_forms(daemon):
    async def main():
        async with AsyncClient(daemon.path, timeout=5) as c:
            with pytest.raises(IgnisError) as ei:
                await c.chat("fail")
            assert ei.value.field == "messages[0].role"
            with pytest.raises(IgnisError):
                async for _ in c.chat("fail", stream=True):
                    pass
            stream = await c.completion("prompt", stream=True)       # awaiting the stream sends it
            assert stream.id is not None
            texts = [e["text"] async for e in stream]
            async with c.chat("forever", stream=True) as s:
                first = await s.__anext__()
                rid = s.id
            await asyncio.sleep(0.05)
            return texts, first, rid, await c.status()
    texts, first, rid, status = asyncio.run(main())
    assert texts == ["Hel", "lo prompt", "Hello prompt"]
    assert first["type"] == "delta" and rid in daemon.cancelled and status["queue"] == {"waiting": 0}


def test_async_not_running(tmp_path):
    async def main():
        await AsyncClient(str(tmp_path / "none.sock")).health()
    with pytest.raises(DaemonNotRunning):
        asyncio.run(main())


# ------------------------------------------------------------------ the ignis command

def test_cli_chat_streams_greedy(daemon, capsys):
    assert cli.main(["chat", "hi", "--socket", daemon.path, "--system", "Be brief.", "--max-tokens", "9"]) == 0
    assert capsys.readouterr().out == "Hello\n"
    req = daemon.requests[0]
    assert req["temperature"] == 0 and req["stream"] is True and req["max_tokens"] == 9
    assert req["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert not {"top_p", "top_k", "min_p", "seed"} & req.keys()        # left to the daemon's defaults


def test_cli_chat_sends_the_sampling_options(daemon, capsys):
    assert cli.main(["chat", "hi", "--socket", daemon.path, "--temperature", "0.7", "--top-p", "0.9", "--top-k",
                     "40", "--min-p", "0.05", "--seed", "3"]) == 0
    req = daemon.requests[0]
    assert (req["temperature"], req["top_p"], req["top_k"], req["min_p"], req["seed"]) == (0.7, 0.9, 40, 0.05, 3)


def test_cli_chat_cut_at_max_tokens_is_a_success_with_a_note(daemon, capsys):
    assert cli.main(["chat", "finish=length", "--socket", daemon.path]) == 0
    assert capsys.readouterr() == ("Hello\n", "ignis: the answer was cut at max_tokens\n")


def test_cli_chat_cancelled_answer_says_so_and_fails(daemon, capsys):
    # the daemon ends an answer it cancels (SIGTERM past the shutdown grace) with finish_reason "cancelled"
    assert cli.main(["chat", "finish=cancelled", "--socket", daemon.path]) == 1
    out, err = capsys.readouterr()
    assert out == "Hello\n"
    assert err == ('ignis: the answer was cut short: the daemon cancelled it (finish_reason "cancelled": it stopped '
                   'or reloaded before the answer was done)\n')


NUMBER_OPTIONS = {   # option: (argv before it, what the refusal says is wanted)
    # --timeout 0 made the socket non-blocking (BlockingIOError), -1 a ValueError; 2e9 s is past the 1e9 cap (time_t
    # overflows near 9.2e9 s)
    "--timeout": (["health"], "a number of seconds above 0 and at most 1,000,000,000 (leave --timeout out to wait "
                              "without a limit)"),
    # the daemon refused -1 too, but as "got -1.0" (argparse's float)
    "--temperature": (["chat", "hi"], "a number from 0 (greedy) to 2"),
    # -1 reached the daemon and came back as an error after connecting (exit 1)
    "--max-tokens": (["chat", "hi"], "a whole number from 1 to 2,147,483,647"),
    # "abc" had no range in argparse's "invalid int value", and 2^70 reached the client's encoder (exit 1)
    "--seed": (["chat", "hi"], "a whole number from -9,223,372,036,854,775,808 to 18,446,744,073,709,551,615"),
    "--top-p": (["chat", "hi"], "a number above 0 and at most 1"),
    "--top-k": (["chat", "hi"], "a whole number from 0 (off) to 2,147,483,647"),
    "--min-p": (["chat", "hi"], "a number from 0 (off) to 1"),
    # a negative rate priced the lost tokens at negative seconds
    "--prefill-rate": (["lint", "/nonexistent/trace.jsonl"], "prefill tokens/s, a finite number above 0"),
}


@pytest.mark.parametrize("option, bad", [("--timeout", b) for b in ("0", "-1", "inf", "nan", "abc", "2e9")]
                         + [("--temperature", b) for b in ("-1", "2.5", "nan", "inf", "warm")]
                         + [("--prefill-rate", b) for b in ("0", "-500", "inf", "nan", "fast")]
                         + [("--max-tokens", b) for b in ("0", "-1", "2147483648", "1.5", "many")]
                         + [("--seed", b) for b in ("abc", "1.5", str(2**64), str(-2**63 - 1))]
                         + [("--top-p", b) for b in ("0", "2", "-0.5", "nan", "most")]
                         + [("--top-k", b) for b in ("-1", "2147483648", "4.5", "all")]
                         + [("--min-p", b) for b in ("-0.1", "1.5", "nan", "some")])
def test_cli_number_options_are_checked_as_typed(option, bad, capsys):
    """argparse refuses each before any connection, exit 2, naming the option and echoing the text given."""
    before, wanted = NUMBER_OPTIONS[option]
    with pytest.raises(SystemExit) as e:
        cli.main([*before, option, bad, "--socket", "/nonexistent/s.sock"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(f"ignis {before[0]}: error: argument {option}: must be {wanted}, "
                                            f"got '{bad}'\n")


@pytest.mark.parametrize("ok, want", [("1", 1), ("2147483647", 2**31 - 1)])
def test_cli_max_tokens_takes_the_range_ends(ok, want):
    assert cli._parser().parse_args(["chat", "hi", "--max-tokens", ok]).max_tokens == want


@pytest.mark.parametrize("ok, want", [(str(-2**63), -2**63), (str(2**64 - 1), 2**64 - 1), ("7", 7)])
def test_cli_seed_takes_the_range_ends(ok, want):
    assert cli._parser().parse_args(["chat", "hi", "--seed", ok]).seed == want


@pytest.mark.parametrize("ok, want", [("0", 0.0), ("2", 2.0), ("0.7", 0.7)])
def test_cli_temperature_takes_the_range_ends(ok, want):
    assert cli._parser().parse_args(["chat", "hi", "--temperature", ok]).temperature == want


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), 2e9, True, "5"])
def test_client_timeout_is_checked_at_construction(bad):
    # timeout=0 made the socket non-blocking (BlockingIOError on the first read), -1 a ValueError deep in
    # socket.settimeout, "5" a TypeError there; all are refused when the client is made, naming the argument
    for cls in (Client, AsyncClient):
        with pytest.raises(ValueError) as e:
            cls("/nonexistent/s.sock", timeout=bad)
        assert str(e.value) == (f"timeout must be a number of seconds above 0 and at most 1,000,000,000, or None to "
                                f"wait without a limit; got {bad!r}")
    assert Client("/nonexistent/s.sock", timeout=None).timeout is None
    assert Client("/nonexistent/s.sock", timeout=2).timeout == 2.0


@pytest.mark.parametrize("bad", [0, -5, 1.5, "1024", False])
def test_client_max_line_bytes_is_checked_at_construction(bad):
    with pytest.raises(ValueError, match=r"^max_line_bytes must be an int of at least 1 \(bytes\); got "):
        Client("/nonexistent/s.sock", max_line_bytes=bad)


def test_cli_reply_timeout_is_not_called_a_connection_failure(daemon, capsys):
    # "slow" answers after 0.3 s: the connection succeeds, the reply is late
    assert cli.main(["chat", "slow", "--timeout", "0.05", "--socket", daemon.path]) == 1
    assert capsys.readouterr().err == f"ignis: the daemon on {daemon.path} did not answer within 0.05 s (--timeout)\n"
    assert cli.main(["chat", "slow", "--timeout", "1e9", "--socket", daemon.path]) == 0     # the cap is allowed


def test_clients_raise_reply_timeout_a_timeout_error(daemon):
    with Client(daemon.path, timeout=0.05) as c, pytest.raises(ReplyTimeout) as ei:
        c.chat("slow")
    assert isinstance(ei.value, TimeoutError) and ei.value.timeout == 0.05
    assert str(ei.value) == "ignisd did not answer within 0.05 s"

    async def main():
        async with AsyncClient(daemon.path, timeout=0.05) as c:
            await c.chat("slow")
    with pytest.raises(ReplyTimeout, match=r"^ignisd did not answer within 0\.05 s$"):
        asyncio.run(main())


def test_cli_status_metrics_health(daemon, capsys):
    assert cli.main(["status", "--json", "--socket", daemon.path]) == 0     # the raw op (bars without --json)
    out = capsys.readouterr().out
    assert json.loads(out) == {"queue": {"waiting": 0}, "lanes": {"total": 8}} and "\n  " in out
    assert cli.main(["metrics", "--socket", daemon.path]) == 0
    assert capsys.readouterr().out == "# TYPE ignis_lanes_busy gauge\nignis_lanes_busy 0.0\n"
    assert cli.main(["health", "--socket", daemon.path]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "model": "fake"}


def test_cli_error_reply(daemon, capsys):
    assert cli.main(["chat", "fail", "--socket", daemon.path]) == 1
    assert "bad_request" in capsys.readouterr().err


def test_cli_daemon_not_running(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "nothing.sock")
    assert cli.main(["status", "--socket", path]) == 1
    err = capsys.readouterr().err
    assert "not running" in err and path in err
    monkeypatch.setenv("IGNIS_SOCKET", path)
    assert cli.main(["health"]) == 1
    assert path in capsys.readouterr().err


# ------------------------------------------------------------------ control plane imports no torch

def test_control_plane_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import ignisd.config, ignisd.log, ignisd.metrics\n"
            "import ignis_client, ignis_client.protocol, ignis_client.client, ignis_client.cli\n"
            "c = ignisd.config.parse_serve_args(['--lanes', '2'], env={})\n"
            "assert c.server.lanes == 2\n"
            "ignisd.metrics.Metrics().render()\n"
            "bad = [m for m in sys.modules if m.startswith(('torch', 'numpy')) and sys.modules[m] is not None]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_cli_names_an_option_given_before_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "unknown option '--bogus' before the command; the commands are chat, status, metrics, health, lint" in err
    assert cli._parser()._subparsers._group_actions[0].choices.keys() == set(cli.COMMANDS)


def test_cli_auth_error_says_how_to_give_the_key(daemon, capsys):
    assert cli.main(["chat", "auth", "--socket", daemon.path]) == 1
    err = capsys.readouterr().err
    assert err == ("ignis: error auth: missing or wrong api_key (field api_key)\n"
                   "ignis: the daemon wants its API key: pass --api-key-file FILE, or set $IGNIS_API_KEY to the key\n")
