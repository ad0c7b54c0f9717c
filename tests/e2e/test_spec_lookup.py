"""End-to-end tests of prompt-lookup speculation (docs/speculative.md):
one `zinfer serve --spec-lookup` with the default model; each request runs
once with speculation and once opted out (sampling_params.speculate
false, the non-speculative path), all at once, so speculating and plain
streams share the worker's steps.

 * Greedy outputs are the same token for token, for input-grounded prompts
   (repeat, fix, extract, quote: drafts get accepted, health says so) and
   free-form ones; max_new_tokens is met exactly (ignore_eos). Under the
   sanitizers three of the six prompts (repeat, quote, one free-form).
 * A stop string cuts the text, and the token ids, where it cuts without
   speculation, though one step may now emit several tokens past it.
 * Seeded sampled requests give the same tokens (the acceptance test uses
   the draw the token gets without speculation), and drafts are accepted.
 * Greedy with penalties, a logit bias, min_new_tokens and log
   probabilities: the same tokens, log probabilities within 1e-5.
 * Structured output: a JSON schema extracting fields from a JSON document
   in the prompt, and a GBNF grammar quoting a sentence: the same tokens,
   valid output, and drafts accepted for these constrained requests.
"""

import os
import sys
import time

import pytest

from conftest import REPO, serve_process

sys.path.insert(0, str(REPO / "clients" / "python"))
from zinfer_client import Client  # noqa: E402

# Under the sanitizers (ZINFER_SANITIZED=1) the cmocka tests test_spec_lookup
# and test_spec_draft check these paths; here the release build only.
SANITIZED = os.environ.get("ZINFER_SANITIZED") == "1"
release_only = pytest.mark.skipif(SANITIZED,
                                  reason="release build only (the unit tests run under the "
                                         "sanitizers)")

PASSAGE = ("The lighthouse at Pointe Noire was built in 1874 by a team of forty masons. "
           "Its lamp burned whale oil until 1902, when kerosene replaced it. "
           "The keeper, Marguerite Olsen, kept a log of every ship that passed for "
           "thirty-one years.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(values) + 1\n")

# (messages text, max_new_tokens, ignore_eos)
PROMPTS = [
    ("Repeat this text exactly, word for word:\n" + PASSAGE, 72, False),
    ("Fix the bug in this function and print the whole corrected function:\n" + CODE, 64, False),
    ("Extract the keeper's name, the year the lighthouse was built and the number of masons "
     "from this passage, as JSON with keys name, year, masons:\n" + PASSAGE, 48, False),
    ("Quote the sentence about the lamp from this passage:\n" + PASSAGE, 40, False),
    ("Write a short poem about the sea.", 37, True),
    ("What is the capital of France? Answer in two sentences.", 29, True),
]


@pytest.fixture(scope="module")
def server(zinfer_bin, model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("spec") / "serve.log"
    with serve_process(zinfer_bin, model_path, log, "--spec-lookup", "--threads-per-worker", 1,
                       "--slots", 16) as srv:
        yield srv


def spec_counts(client):
    time.sleep(1.2)  # a heartbeat carries the counters
    kv = client.call("health")["kv"]
    return kv["spec_steps"], kv["spec_drafted"], kv["spec_accepted"]


def run_both(client, requests, **extra):
    """Sends every (messages, sampling_params[, extra fields]) twice at
    once, speculating and opted out; returns [((tokens, text, final, logprobs) speculating,
    (the same) plain)]; logprobs: [(token's, {top id: value})] gathered
    from the chunks."""
    rids = []
    for messages, sp, *more in requests:
        for spec in (True, False):
            rids.append(client.send({"op": "generate", "messages": messages,
                                     "sampling_params": {**sp, "speculate": spec}, **extra,
                                     **(more[0] if more else {})}))
    out = []
    for rid in rids:
        ids, text, final, lps = [], [], None, []
        for ev in client.events(rid):
            assert ev["event"] in ("chunk", "final"), ev
            ids.extend(ev.get("token_ids", []))
            text.append(ev.get("text", ""))
            if ev.get("logprobs") and ev["event"] == "chunk":
                lp = ev["logprobs"]
                lps.extend(zip(lp["token_log_probabilities"], lp["top_log_probabilities"]))
            if ev["event"] == "final":
                final = ev
        out.append((ids, "".join(text), final, lps))
    return [(out[i], out[i + 1]) for i in range(0, len(out), 2)]


def test_greedy_same_tokens_with_and_without(server):
    # Under the sanitizers three of the six: the repeat (drafts accepted),
    # the quote and a free-form one with ignore_eos (the exact budget).
    prompts = [PROMPTS[i] for i in (0, 3, 5)] if SANITIZED else PROMPTS
    with Client(server.addr, timeout_s=300) as c:
        before = spec_counts(c)
        reqs = [([{"role": "user", "content": text}],
                 {"temperature": 0, "max_new_tokens": n, "ignore_eos": ign})
                for text, n, ign in prompts]
        pairs = run_both(c, reqs)
        after = spec_counts(c)
    for (text, n, ign), (spec, plain) in zip(prompts, pairs):
        assert spec[0] == plain[0], text
        assert spec[1] == plain[1], text
        assert spec[2]["status"] == plain[2]["status"], text
        assert len(spec[0]) <= n
        if ign:
            assert len(spec[0]) == n  # max_new_tokens exactly, never more
    # the repeat prompt copies the passage (the model does so, with or without)
    assert "Marguerite Olsen" in pairs[0][0][1]
    steps, drafted, accepted = (a - b for a, b in zip(after, before))
    print(f"speculation: {steps} verifications, {drafted} drafted, {accepted} accepted")
    assert accepted > 0 and drafted >= accepted and steps > 0
    # the metrics op (zinfer-http's /metrics) has each worker's counters
    with Client(server.addr, timeout_s=60) as c:
        w = c.call("metrics")["workers"]
    assert sum(x["spec_accepted"] for x in w) >= accepted
    assert sum(x["spec_drafted"] for x in w) >= drafted


@release_only
def test_stop_string_cuts_where_it_cuts_without(server):
    messages = [{"role": "user", "content": "Repeat this text exactly, word for word:\n" + PASSAGE}]
    with Client(server.addr, timeout_s=300) as c:
        pairs = run_both(c, [(messages, {"temperature": 0, "max_new_tokens": 72,
                                         "stop": ["whale oil"]}),
                             (messages, {"temperature": 0, "max_new_tokens": 72,
                                         "stop": ["kerosene"]})])
    for spec, plain in pairs:
        assert spec[1] == plain[1]
        assert spec[0] == plain[0]
        assert spec[2]["status"] == plain[2]["status"] == "stop"
    assert pairs[0][0][1].rstrip().endswith("burned")


def test_opt_out_does_not_speculate(server):
    messages = [{"role": "user", "content": "Repeat this text exactly, word for word:\n" + PASSAGE}]
    with Client(server.addr, timeout_s=300) as c:
        before = spec_counts(c)
        _, ids, _ = c.complete(messages=messages, sampling_params={
            "temperature": 0, "max_new_tokens": 40, "speculate": False})
        after = spec_counts(c)
    assert len(ids) > 20
    assert after == before  # no draft was fed for it


GROUNDED = [p for p in PROMPTS if not p[2]]


@release_only
def test_sampled_seeded_same_tokens_and_accepted(server):
    with Client(server.addr, timeout_s=300) as c:
        before = spec_counts(c)
        reqs = [([{"role": "user", "content": text}],
                 {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "seed": 11 + i,
                  "max_new_tokens": n}) for i, (text, n, _) in enumerate(GROUNDED)]
        pairs = run_both(c, reqs)
        after = spec_counts(c)
    for (text, _, _), (spec, plain) in zip(GROUNDED, pairs):
        assert spec[0] == plain[0], text
        assert spec[1] == plain[1] and spec[2]["status"] == plain[2]["status"], text
        assert len(spec[0]) > 5
    steps, drafted, accepted = (a - b for a, b in zip(after, before))
    print(f"sampled: {steps} verifications, {drafted} drafted, {accepted} accepted")
    assert accepted > 0 and drafted >= accepted


@release_only
def test_penalties_bias_logprobs_same_as_without(server):
    sp = {"temperature": 0, "repetition_penalty": 1.1, "frequency_penalty": 0.2,
          "presence_penalty": 0.1, "logit_bias": {13: 1.0, 28: -3.0}, "min_new_tokens": 12}
    with Client(server.addr, timeout_s=300) as c:
        before = spec_counts(c)
        pairs = run_both(c, [([{"role": "user", "content": text}], {**sp, "max_new_tokens": n})
                             for text, n, _ in GROUNDED], logprobs=3)
        after = spec_counts(c)
    for (text, _, _), (spec, plain) in zip(GROUNDED, pairs):
        assert spec[0] == plain[0], text
        assert len(spec[3]) == len(plain[3]) == len(spec[0]) >= 12, text
        for (a, atop), (b, btop) in zip(spec[3], plain[3]):
            assert a == pytest.approx(b, abs=1e-5)
            assert set(atop) == set(btop)
            for t in atop:
                assert atop[t] == pytest.approx(btop[t], abs=1e-5)
    steps, drafted, accepted = (a - b for a, b in zip(after, before))
    print(f"penalised: {steps} verifications, {drafted} drafted, {accepted} accepted")
    assert accepted > 0


@pytest.mark.no_zinfer
def test_workload_fixture():
    """The input-grounded set scripts/bench-spec measures (at least 12
    prompts: code edits, quotes, JSON extraction)."""
    import json
    d = json.loads((REPO / "tests" / "fixtures" / "spec_prompts.json").read_text())
    ps = d["prompts"]
    assert len(ps) >= 12 and len({p["name"] for p in ps}) == len(ps)
    assert {p["kind"] for p in ps} == {"code", "quote", "json"}
    for p in ps:
        assert 16 <= p["max_new_tokens"] <= 512
        assert p["messages"][0]["role"] == "user" and len(p["messages"][0]["content"]) > 300


ORDER = ('{"order_id": "A-7731", "customer": {"name": "Ingrid Halvorsen", "city": "Bergen"}, '
         '"items": [{"sku": "LMP-204", "qty": 3}], "status": "shipped", '
         '"carrier": "Nordlys Freight"}')
ORDER_SCHEMA = {"type": "object",
                "properties": {"order_id": {"type": "string"},
                               "customer_name": {"type": "string"},
                               "city": {"type": "string"},
                               "carrier": {"type": "string"}},
                "required": ["order_id", "customer_name", "city", "carrier"]}
QUOTE_GRAMMAR = 'root ::= "\\"" [^"\\n]+ "\\""'


@release_only
def test_structured_output_speculates_same_tokens(server):
    """Each verification row is masked by the grammar after the drafts
    before it (docs/speculative.md): the same tokens as without, and the
    constrained requests get drafts accepted."""
    import json
    reqs = [([{"role": "user", "content": "Extract the order id, the customer's name, the city "
                                          "and the carrier from this JSON document:\n" + ORDER}],
             {"temperature": 0, "max_new_tokens": 64},
             {"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}}),
            ([{"role": "user", "content": "Quote the sentence about the lamp from this "
                                          "passage:\n" + PASSAGE}],
             {"temperature": 0, "max_new_tokens": 48}, {"grammar": QUOTE_GRAMMAR})]
    with Client(server.addr, timeout_s=300) as c:
        before = spec_counts(c)
        pairs = run_both(c, reqs)
        after = spec_counts(c)
    for (spec, plain) in pairs:
        assert spec[0] == plain[0] and spec[1] == plain[1]
        assert spec[2]["status"] == plain[2]["status"]
    doc = json.loads(pairs[0][0][1])
    assert set(ORDER_SCHEMA["required"]) <= set(doc)
    assert doc["order_id"] == "A-7731" and doc["city"] == "Bergen", doc
    quote = pairs[1][0][1]
    assert quote.startswith('"') and quote.endswith('"') and "lamp" in quote, quote
    steps, drafted, accepted = (a - b for a, b in zip(after, before))
    print(f"constrained: {steps} verifications, {drafted} drafted, {accepted} accepted")
    assert accepted > 0 and drafted >= accepted
