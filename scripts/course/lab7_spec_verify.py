# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Lab 7's page: speculative decoding by prompt lookup, its greedy verification and the commit."""

from cells import code, conclusion, md
from labpage import engine_on_your_part, grade_it, header, summary, your_file

CELLS = [
    *header(7, "spec_verify", "Speculative decoding: prompt lookup and verification", [
        "See the engine propose tokens from a request's own text, verify them in one forward pass and keep the agreeing prefix plus its own token.",
        "Write `propose`, `accept`, `verify_step` and `commit_verified` yourself, from the skeleton, and grade them.",
        "Run the whole engine on your speculative decoding and watch proposals accepted and rejected in the dashboard's figures.",
    ], "[chapter 13, speculative decoding, the math](13_spec_decode_math.ipynb)"),
    md("""
    ## The part: propose, verify, commit
    Prompt lookup proposes the tokens that followed the last time the request's latest tokens appeared in its own
    text. One forward pass scores the pending token and every proposal; greedy verification keeps the longest prefix of
    proposals equal to the model's own argmax, then the model's token at the first disagreement (or a bonus token
    when all agree). The rejected proposals' KV slots are given back. Below, the grader's speculative workload runs on
    the real engine; each row is one verify step of the request that kept the most proposals. The same workload without speculation checks that
    the output is the same.
    """),
    code("""
    from minengine.labs.spec_verify_lab import SPECULATIVE

    print("speculative_config:", SPECULATIVE.settings["speculative_config"])
    engine, spec_tokens = serve(SPECULATIVE)
    plain_settings = {k: v for k, v in SPECULATIVE.settings.items() if k != "speculative_config"}
    plain, plain_tokens = serve(Workload("plain", plain_settings, SPECULATIVE.prompts, SPECULATIVE.max_tokens))
    rows = [(t.step, c) for t in engine.traces for c in t.chunks if c.num_spec_tokens]
    kept_most = max({c.request_id for _, c in rows}, key=lambda rid: sum(c.num_accepted_tokens for _, c in rows if c.request_id == rid))
    for step, c in [(s, c) for s, c in rows if c.request_id == kept_most][:10]:   # the request that kept the most
        kept = "x" * c.num_accepted_tokens + "-" * (c.num_spec_tokens - c.num_accepted_tokens)
        print(f"step {step:2} {c.request_id}: proposed {c.num_spec_tokens}, accepted {c.num_accepted_tokens} [{kept}]"
              f" -> {c.num_accepted_tokens + 1} tokens this step")
    print("(x: an accepted proposal, -: a rejected one; +1: the model's own token)")
    from minengine.viz.batch_figure import spec_decode_figure

    titled(spec_decode_figure(engine.traces), "Proposals accepted and rejected, step by step").show()
    """),
    conclusion("""
    proposed = sum(c.num_spec_tokens for _, c in rows)
    accepted = sum(c.num_accepted_tokens for _, c in rows)
    conclude(f"Over {len(rows)} verify steps the engine proposed **{proposed}** tokens and kept **{accepted}** "
             f"({accepted / proposed:.0%}); its output is the same as without speculation, token for token, in "
             f"**{len(engine.traces)} steps** instead of {len(plain.traces)}.",
             [("never more accepted than proposed", all(c.num_accepted_tokens <= c.num_spec_tokens for _, c in rows)),
              ("some proposals accepted, some rejected", 0 < accepted < proposed),
              ("speculation is exact", spec_tokens == plain_tokens),
              ("accepted proposals save steps", len(engine.traces) < len(plain.traces))])
    """),
    *your_file("spec_verify", "You write `propose` (the earliest earlier occurrence of the longest matching suffix, then up to k tokens), `accept` (the agreeing prefix, then the correction or the bonus token), `verify_step` (each request's own rows of a step's argmax) and `commit_verified` (progress, the rejected proposals' blocks freed, a stop in the middle)."),
    *grade_it("spec_verify"),
    *engine_on_your_part(
        "spec_verify", "SPECULATIVE",
        "the engine proposes, verifies and commits through your functions",
        """
        titled(spec_decode_figure(mine.traces), "Proposals your functions made, accepted and rejected").show()
        titled(viz.batch_composition_figure(mine.traces), "Each step's tokens: decodes with their proposals").show()
        """,
        "the proposals accepted and rejected, then each step's tokens"),
    *summary([
        "Prompt lookup proposes from the request's own text, so repeated text is where proposals agree with the model.",
        "Greedy verification keeps the agreeing prefix plus the model's own token, so the output is the model's own, token for token, only in fewer steps when proposals agree (checked: accepted proposals save steps).",
        "The grader checks each function case by case, random proposals against the reference, then the whole engine on your speculative decoding against transformers.",
    ]),
]
