"""One option table (common/options.h): every option `zinfer serve` passes to
a child is accepted or refused by serve exactly as by the child itself, at
each bound and one past it, with the same message; and each --help states
the range that is checked.

The expected ranges are written out here (SPEC), apart from the table, so
that a bound changed in the table by mistake fails this test, and a child
that checked its own, different bound would fail the serve-vs-child
comparison. "Accepted" is `--check-args`: each binary reads and checks its
whole command line as it would to start, then exits 0 without starting (a
child opens no file; serve also checks that --model's file, the default
model here, can be read). A refused value is also refused, with the same
message, when the child is started for real (no --check-args): the check
comes before anything starts.
"""

import re
import subprocess

import pytest

# (serve's name or None, child, child's name or None, kind, lo, hi): None
# where only the other one takes the option.
SPEC = [
    ("--workers", None, None, "int", 1, 64),
    ("--tokenizers", None, None, "int", 1, 64),
    ("--threads-per-worker", "worker", "--threads", "int", 0, 1024),
    ("--slots", "worker", "--slots", "int", 1, 1024),
    ("--ctx-size", "worker", "--ctx-size", "int", 16, 1 << 20),
    ("--kv-cache-tokens", "worker", "--kv-cache-tokens", "int", 1, 1 << 30),
    ("--kv-cache-bytes", "worker", "--kv-cache-bytes", "size", 1, 1 << 50),
    ("--memory-budget", "worker", "--memory-budget", "size", 1, 1 << 50),
    ("--batch-size", "worker", "--batch-size", "int", 1, 65536),
    ("--prefill-chunk", "worker", "--prefill-chunk", "int", 0, 65536),
    ("--block-size", "worker", "--block-size", "int", 1, 4096),
    ("--num-steps", "worker", "--num-steps", "int", 1, 64),
    ("--max-queue", "router", "--max-queue", "int", 1, 1 << 24),
    ("--max-queue-per-model", "router", "--max-queue-per-model", "int", 0, 1 << 24),
    ("--max-prompt-tokens", "router", "--max-prompt-tokens", "int", 1, 1 << 24),
    ("--max-new-tokens", "router", "--max-new-tokens", "int", 1, 1 << 24),
    ("--max-thinking-tokens", "router", "--max-thinking-tokens", "int", 0, 1000000),
    ("--max-embed-inputs", "router", "--max-embed-inputs", "int", 1, 65536),
    ("--max-embed-tokens", "router", "--max-embed-tokens", "int", 1, 1 << 20),
    ("--heartbeat-timeout", "router", "--heartbeat-timeout", "int", 100, 3600000),
    ("--failover-timeout", "router", "--failover-timeout", "int", 0, 3600000),
    ("--request-timeout", "router", "--request-timeout", "int", 0, 86400000),
    ("--client-heartbeat", "router", "--client-heartbeat", "int", 0, 3600000),
    (None, "router", "--max-frame-bytes", "int", 1024, 1 << 31),
    ("--http-max-body-bytes", "http", "--max-body-bytes", "size", 64, 1 << 30),
    ("--http-max-connections", "http", "--max-connections", "int", 1, 65536),
    ("--http-timeout", "http", "--timeout", "int", 1, 86400),
    ("--http-header-timeout", "http", "--header-timeout", "int", 1, 86400),
    (None, "http", "--max-header-bytes", "size", 1024, 1 << 24),
    ("--router-timeout", "http", "--router-timeout", "int", 1, 86400),
    ("--responses-store-max", "http", "--responses-store-max", "int", 0, 65536),
    ("--responses-store-bytes", "http", "--responses-store-bytes", "size", 0, 1 << 36),
]

# Options with words or choices: (serve's name, child, child's name,
# accepted, refused with the message's tail).
CHOICES = [
    ("--act-bits", "worker", "--act-bits", ["8", "16"],
     [("7", "is not an integer in 8..16"), ("12", "is not 8 or 16"),
      ("17", "is not an integer in 8..16")]),
    ("--kv-type", "worker", "--kv-type", ["default", "f16", "q8_0", "q4_0"],
     [("q4_1", "is not default, f16, q8_0 or q4_0"), ("", "is not default, f16, q8_0 or q4_0"),
      ("Q8_0", "is not default, f16, q8_0 or q4_0")]),
    ("--log-level", "router", "--log-level", ["debug", "info", "warn", "error", "off"],
     [("verbose", "is not debug, info, warn, error or off")]),
    ("--log-level", "worker", "--log-level", ["off"],
     [("", "is not debug, info, warn, error or off")]),
    ("--log-level", "tokenizer", "--log-level", ["warn"],
     [("INFO", "is not debug, info, warn, error or off")]),
    ("--log-level", "http", "--log-level", ["error"],
     [("x", "is not debug, info, warn, error or off")]),
    ("--http", "http", "--listen",
     ["127.0.0.1:1", "127.0.0.1:65535", "[::1]:8080", "h" * 255 + ":80"],
     [(v, "is not HOST:PORT") for v in ["h:0", "h:65536", ":80", "h:", "nope",
                                        "h" * 256 + ":80"]]),
    ("--device", "worker", "--device", ["cpu", "cuda:0"], [("tpu", ""), ("cuda:x", "")]),
    ("--reasoning-format", "http", "--reasoning-format", ["separate", "none"],
     [("deepseek", "is not separate or none"), ("", "is not separate or none")]),
    ("--tool-call-format", "http", "--tool-call-format",
     ["auto", "generic", "hermes", "mistral", "llama3", "qwen3-coder", "gpt-oss", "deepseek-v3",
      "deepseek-v3.2", "glm-4.5", "kimi-k2", "granite", "command-r", "functionary",
      "functionary-v3.1"],
     [("qwen3", "is not auto, generic, hermes, mistral, llama3, qwen3-coder, gpt-oss, "
       "deepseek-v3, deepseek-v3.2, glm-4.5, kimi-k2, granite, command-r, functionary or "
       "functionary-v3.1")]),
]

FLAGS = [("--no-prefix-cache", "worker"), ("--spec-lookup", "worker"),
         ("--no-spec-lookup", "worker"), ("--insecure", "router"), ("--no-webui", "http")]


@pytest.fixture(scope="module")
def bins(zinfer_bin):
    d = zinfer_bin.parent
    return {"serve": zinfer_bin, "router": d / "zinfer-router", "worker": d / "zinfer-worker",
            "tokenizer": d / "zinfer-tokenizer", "http": d / "zinfer-http"}


PROG = {"serve": "zinfer serve", "router": "zinfer-router", "worker": "zinfer-worker",
        "tokenizer": "zinfer-tokenizer", "http": "zinfer-http"}


def verdict(bins, model, who, flag, value, check=True):
    """(exit status, the message without its program prefix or None)."""
    if who == "serve":
        cmd = [str(bins["serve"]), "serve", "--model", str(model)]
    else:
        cmd = [str(bins[who])]
    if check:
        cmd.append("--check-args")
    cmd += [flag] + ([value] if value is not None else [])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    err = res.stderr.strip()
    if res.returncode == 0:
        assert err == "", f"{cmd}: accepted but said {err!r}"
        return 0, None
    lines = err.splitlines()
    assert res.returncode == 2 and len(lines) == 1, f"{cmd}: exit {res.returncode}, {err!r}"
    prefix = PROG[who] + ": "
    assert lines[0].startswith(prefix), lines[0]
    return 2, lines[0][len(prefix):]


def spelled(msg, serve_name, child_name):
    """serve's message as the child would say it (serve names some options
    differently: --http-timeout is zinfer-http's --timeout)."""
    return msg.replace(serve_name + ":", child_name + ":", 1) if msg else msg


def bound_cases():
    for serve_name, child, child_name, kind, lo, hi in SPEC:
        for value, ok in [(lo - 1, False), (lo, True), (hi, True), (hi + 1, False)]:
            yield pytest.param(serve_name, child, child_name, kind, lo, hi, value, ok,
                               id=f"{serve_name or child_name}={value}")


@pytest.mark.parametrize("serve_name,child,child_name,kind,lo,hi,value,ok", list(bound_cases()))
def test_bounds_same_everywhere(bins, model_path, serve_name, child, child_name, kind, lo,
                                hi, value, ok):
    what = "an integer in" if kind == "int" else "a size in"
    want = None if ok else f"{{flag}}: '{value}' is not {what} {lo}..{hi}"
    got = []
    if serve_name:
        rc, msg = verdict(bins, model_path, "serve", serve_name, str(value))
        assert rc == (0 if ok else 2), (serve_name, value, msg)
        if not ok:
            assert msg.startswith(want.format(flag=serve_name)), msg
        got.append(spelled(msg, serve_name, child_name or serve_name))
    if child:
        rc, msg = verdict(bins, model_path, child, child_name, str(value))
        assert rc == (0 if ok else 2), (child, child_name, value, msg)
        if not ok:
            assert msg.startswith(want.format(flag=child_name)), msg
            # refused the same way when started for real
            assert verdict(bins, model_path, child, child_name, str(value),
                           check=False) == (2, msg)
        got.append(msg)
    assert len(set(got)) == 1, got


def choice_cases():
    for serve_name, child, child_name, good, bad in CHOICES:
        for v in good:
            yield pytest.param(serve_name, child, child_name, v, None,
                               id=f"{child}{child_name}={v[:20]}")
        for v, tail in bad:
            yield pytest.param(serve_name, child, child_name, v, tail,
                               id=f"{child}{child_name}={v[:20]}-refused")


@pytest.mark.parametrize("serve_name,child,child_name,value,tail", list(choice_cases()))
def test_choices_same_everywhere(bins, model_path, serve_name, child, child_name, value,
                                 tail):
    s = verdict(bins, model_path, "serve", serve_name, value)
    c = verdict(bins, model_path, child, child_name, value)
    assert s[0] == c[0] == (0 if tail is None else 2), (s, c)
    assert spelled(s[1], serve_name, child_name) == c[1]
    if tail:  # "" : refused, by zi_device_parse's own words
        assert c[1] == f"{child_name}: '{value}' {tail}", c[1]


@pytest.mark.parametrize("flag,child", FLAGS)
def test_flags_same_everywhere(bins, model_path, flag, child):
    assert verdict(bins, model_path, "serve", flag, None) == (0, None)
    assert verdict(bins, model_path, child, flag, None) == (0, None)


def test_serve_only_values(bins, model_path):
    """--http off is serve's own (no zinfer-http); a missing value or an
    unknown option is refused the same way by every binary."""
    assert verdict(bins, model_path, "serve", "--http", "off") == (0, None)
    for who in PROG:
        assert verdict(bins, model_path, who, "--bogus", None) == (
            2, "unknown option '--bogus' (see --help)")
    assert verdict(bins, model_path, "serve", "--slots", None) == (
        2, "--slots needs a value (see --help)")
    assert verdict(bins, model_path, "worker", "--slots", None) == (
        2, "--slots needs a value (see --help)")


def test_check_args_refuses_what_a_start_refuses(bins, model_path):
    """Rules between options (not one option's range) are checked before
    --check-args answers, so it refuses exactly what a start would."""
    cases = [("router", ["--backend", "tcp://10.1.2.3:5556"], "is not a loopback address"),
             ("router", ["--backend-keys", "/nonexistent"], "--backend-keys needs --curve-secret"),
             ("router", ["--curve-secret", "/nonexistent"], "--curve-secret needs --backend-keys"),
             ("worker", ["--device", "cuda", "--act-bits", "8"], "--act-bits 8 is a CPU option"),
             ("serve", ["--device", "cuda", "--act-bits", "8"], "--act-bits 8 is a CPU option")]
    for who, args, text in cases:
        for check in (True, False):
            cmd = [str(bins[who])]
            if who == "serve":
                cmd += ["serve", "--model", str(model_path)]
            cmd += (["--check-args"] if check else []) + args
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            assert res.returncode == 2 and text in res.stderr, (cmd, res.returncode, res.stderr)
    ok = [str(bins["router"]), "--check-args", "--backend", "tcp://10.1.2.3:5556", "--insecure"]
    assert subprocess.run(ok, capture_output=True, timeout=30).returncode == 0


def test_help_states_the_ranges(bins):
    """Each --help prints the range its binary checks, from the table."""
    def help_of(who):
        cmd = [str(bins[who])] + (["serve"] if who == "serve" else []) + ["--help"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        return " ".join(res.stdout.split())

    texts = {who: help_of(who) for who in PROG}
    for serve_name, child, child_name, kind, lo, hi in SPEC:
        if kind != "int":
            continue
        for who, name in (("serve", serve_name), (child, child_name)):
            if who and name:
                assert re.search(rf"{re.escape(name)} \S+ [^\[]*\[{lo}\.\.{hi}\]", texts[who]), \
                    (who, name, lo, hi)


def test_lora_value_same_everywhere(bins, model_path):
    """--lora NAME=FILE[:SCALE] (repeatable): serve and zinfer-worker read
    the value the same way (model_worker/lora.h zi_lora_spec_parse); serve
    also needs the file (it passes its real path on)."""
    for value, msg in [("noequals", "--lora 'noequals': expected NAME=FILE[:SCALE]"),
                       ("a=", "--lora 'a=': no FILE after '='"),
                       ("a b=f.gguf", "--lora 'a b=f.gguf': a name has no spaces, control "
                                      "characters or ':'")]:
        assert verdict(bins, model_path, "serve", "--lora", value) == (2, msg)
        assert verdict(bins, model_path, "worker", "--lora", value) == (2, msg)
    assert verdict(bins, model_path, "worker", "--lora", "a=/nonexistent.gguf:0.5") == (0, None)
    assert verdict(bins, model_path, "serve", "--lora", "a=/nonexistent.gguf:0.5") == (
        2, "--lora /nonexistent.gguf: No such file or directory")
