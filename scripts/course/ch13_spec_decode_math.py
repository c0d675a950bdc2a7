# ruff: noqa: E501  (markdown and cell sources are long by nature)
"""Chapter 13: speculative decoding, the math: expected tokens per verify step (1 - a^(k+1)) / (1 - a) (Leviathan et
al., 2023) against the engine's measured acceptance (n-gram proposer; the traces record accepted and rejected); when
it pays on the modelled clock and when not."""

from cells import SETUP, code, conclusion, exercise, glossary, header, md, question, summary

CELLS = [
    *header(13, "Speculative decoding, the math", [
        "Derive the expected tokens per verify step, (1 - α^(k+1)) / (1 - α), from the accept-until-the-first-rejection rule, and check it by simulation.",
        "Measure the acceptance of the engine's n-gram proposer from its step traces, estimate α properly, and see where the i.i.d. model fits and where it does not.",
        "Tell the engine's acceptance rate (accepted / proposed) from the α of the formula.",
        "Price a verify step on the modelled clock and find when speculation pays (small batches, memory-bound) and when it does not (large batches, low acceptance).",
    ], ["Leviathan, Kalman & Matias, *Fast Inference from Transformers via Speculative Decoding*, ICML 2023 (section 3, equation 1; the improvement factor, Theorem 3.8)",
        "Chen et al., *Accelerating Large Language Model Decoding with Speculative Sampling*, 2023",
        "Saxena, *Prompt Lookup Decoding*, 2023; vLLM docs, *Speculative Decoding* (`method=\"ngram\"`, acceptance metrics)",
        "minengine `core/spec_decode.py` (proposer, `SpecDecodeStats`) and `benchmarks/spec_decode.py`"]),
    code(SETUP + """\
import math
import random

from minengine.core.spec_decode import SpecDecodeStats
from minengine.course import teaching_cost_model
from minengine.timing import StepWork
from minengine.workloads import SHAKESPEARE_OPENINGS, find_data_dir
"""),
    md("""
    ## The rule and the formula
    A step of speculative decoding gives a running request `k` **proposed** tokens after its own pending token. The
    target model computes all `1 + k` positions in one forward, then keeps the proposals up to the **first** one it
    disagrees with, and adds one token of its own there (the correction; or, when all `k` were accepted, the bonus token
    after them). So a verify step yields between 1 and `k + 1` tokens (chapter 6 ran it).

    Suppose each proposal is accepted with the same probability `α`, independently of the others (Leviathan et al.'s
    simplifying assumption). The step yields at least `i + 1` tokens exactly when the first `i` proposals are all
    accepted, probability `α^i`. Summing over `i = 0 … k`:

        E[tokens per verify step] = 1 + α + α² + … + α^k = (1 - α^(k+1)) / (1 - α)

    With `α = 0.8` and `k = 4` that is 3.36 tokens for one forward; with `α = 0.3`, 1.43.

    ## Toy: simulate the rule
    """),
    code("""
    def expected_tokens(alpha, k):
        \"\"\"Leviathan et al.'s expected tokens per verify step, k proposals each accepted with probability alpha.\"\"\"
        return k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


    import numpy as np


    def simulate(alpha, k, steps, rng):
        \"\"\"Mean tokens per step when each proposal is accepted with probability alpha until the first rejection.\"\"\"
        coin = rng.random((steps, k)) < alpha              # would proposal i be accepted if it were reached?
        accepted = np.cumprod(coin, axis=1).sum(axis=1)    # the run of acceptances up to the first rejection
        return float((accepted + 1).mean())                # + the target's own token (correction or bonus)


    rng = np.random.default_rng(0)
    ks = list(range(1, 9))
    alphas = [0.3, 0.6, 0.9]
    sims = {a: [simulate(a, k, 50_000, rng) for k in ks] for a in alphas}
    fig = go.Figure()
    for a in alphas:
        fig.add_trace(go.Scatter(x=ks, y=[expected_tokens(a, k) for k in ks], name=f"formula, α = {a}", mode="lines"))
        fig.add_trace(go.Scatter(x=ks, y=sims[a], name=f"simulated, α = {a}", mode="markers"))
    titled(fig, "Tokens per verify step vs proposals k", clock_label="no clock: a count (simulation with a seeded generator)")
    fig.update_layout(xaxis_title="proposals per step k", yaxis_title="tokens per verify step")
    fig.show()
    """),
    conclusion("""
    worst = max(abs(s - expected_tokens(a, k)) / expected_tokens(a, k) for a in alphas for k, s in zip(ks, sims[a]))
    conclude(f"Simulated with independent acceptances, the mean tokens per step lie within **{worst:.1%}** of the formula for every α and k "
             f"above. The returns diminish: at α = 0.6, going from k = 4 to 8 adds {expected_tokens(0.6, 8) - expected_tokens(0.6, 4):.2f} tokens "
             f"per step, because a proposal only counts if all before it were accepted; the limit as k grows is 1 / (1 - α) = {1 / 0.4:.1f}.",
             [("simulation and formula agree within 3 %", worst < 0.03),
              ("more proposals help less and less", all(expected_tokens(0.6, k + 1) - expected_tokens(0.6, k) < expected_tokens(0.6, k) - expected_tokens(0.6, k - 1) for k in ks[1:-1])),
              ("the limit is 1 / (1 - alpha)", expected_tokens(0.6, 8) < 1 / 0.4),
              ("the worked examples: 3.36 at alpha 0.8, k 4; 1.43 at alpha 0.3", (round(expected_tokens(0.8, 4), 2), round(expected_tokens(0.3, 4), 2)) == (3.36, 1.43))])
    """),
    md("""
    ## Measure: the engine's n-gram proposer
    The engine's proposer (`core/spec_decode.py`, prompt lookup) finds the request's last n-gram earlier in its own text
    and proposes what followed it there. Each step's trace records, per request, how many tokens it proposed
    (`num_spec_tokens`) and how many the model accepted (`num_accepted_tokens`). Three workloads on the bundled model,
    `k = 4`, n-grams of 1 to 3 tokens:
    - **copy**: a Tiny Shakespeare passage followed by its own first 16 tokens, greedy (the model goes on copying what it read);
    - **random, greedy**: prompts of random token ids (no repeated n-gram to copy, but a tiny model's greedy text repeats itself);
    - **random, sampled**: the same prompts at temperature 1 (seeded): the text barely repeats.
    """),
    code("""
    SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    K = SPEC["num_speculative_tokens"]
    tokenizer = modelled_engine(trace_block_tables=False).tokenizer
    data = find_data_dir()
    corpus = (data / "text" / "tinyshakespeare.txt").read_text()[:100_000] if data and (data / "text" / "tinyshakespeare.txt").exists() else "".join(SHAKESPEARE_OPENINGS) * 20
    corpus_ids = tokenizer(corpus)["input_ids"]
    rng = random.Random(0)


    def copy_prompt(length=96):
        start = rng.randrange(0, len(corpus_ids) - length)
        passage = corpus_ids[start:start + length]
        return passage + passage[:16]


    def random_prompt(length=64):
        return [rng.randrange(3, len(tokenizer)) for _ in range(length)]


    def serve(prompts, params, spec, budget=2048):
        eng = modelled_engine(max_num_batched_tokens=budget, max_num_seqs=256, speculative_config=spec, trace_block_tables=False)
        for i, (p, sp) in enumerate(zip(prompts, params)):
            eng.add_request(f"r{i}", {"prompt_token_ids": p}, sp)
        return eng, run_to_completion(eng)


    N_REQ, N_OUT = pick(16, 8), pick(48, 32)
    greedy = SamplingParams(temperature=0.0, max_tokens=N_OUT, ignore_eos=True)
    random_prompts = [random_prompt() for _ in range(N_REQ)]
    WORKLOADS = {"copy": ([copy_prompt() for _ in range(N_REQ)], [greedy] * N_REQ),
                 "random, greedy": (random_prompts, [greedy] * N_REQ),
                 "random, sampled": (random_prompts, [SamplingParams(temperature=1.0, seed=i, max_tokens=N_OUT, ignore_eos=True) for i in range(N_REQ)])}
    runs = {name: serve(prompts, params, SPEC)[0] for name, (prompts, params) in WORKLOADS.items()}


    def drafts_of(eng):
        \"\"\"(proposed, accepted) of every decode that carried proposals, from the step traces.\"\"\"
        return [(c.num_spec_tokens, c.num_accepted_tokens) for t in eng.traces for c in t.chunks if c.num_spec_tokens]


    for name, eng in runs.items():
        st = SpecDecodeStats.of_steps(eng.traces)
        decodes = sum(1 for t in eng.traces for c in t.chunks if not c.is_prefill)
        print(f"{name:16s} drafted decodes {st.num_drafts:4d} of {decodes:4d} | proposed {st.num_draft_tokens:4d} | accepted {st.num_accepted_tokens:4d} "
              f"| acceptance rate {st.acceptance_rate:.2f} | tokens per drafted decode {st.mean_acceptance_length:.2f}")
    """),
    md("""
    ### Which α?
    The engine (like vLLM) reports the **acceptance rate**, accepted / proposed. That is *not* the `α` of the formula: a
    draft whose first proposal is rejected counts all its `k` proposals as proposed, although the later ones never had
    a chance. Under the formula's model each proposal that is *reached* is a coin flip: a draft with `a` accepted of `k`
    is `a` heads and, if `a < k`, one tail. The estimate of `α` from the drafts is heads / (heads + tails) (the maximum
    likelihood estimate of a geometric run cut at `k`; Exercise 2). Then the formula, draft by draft with its own `k`
    (the proposer proposes fewer when the text after a match is short), predicts the tokens per drafted decode:
    """),
    code("""
    def alpha_hat(drafts):
        heads = sum(a for k, a in drafts)
        tails = sum(1 for k, a in drafts if a < k)
        return heads / (heads + tails)


    def predicted_tokens(drafts, alpha):
        return sum(expected_tokens(alpha, k) for k, _ in drafts) / len(drafts)


    def conditional_acceptance(drafts, k=K):
        \"\"\"P(proposal i accepted | proposals before it accepted), for i = 1..k, over the drafts that reached i.\"\"\"
        out = []
        for i in range(k):
            reached = [a for kk, a in drafts if kk > i and a >= i]
            out.append(sum(a > i for a in reached) / len(reached) if reached else None)
        return out


    rows = {}
    for name, eng in runs.items():
        d, st = drafts_of(eng), SpecDecodeStats.of_steps(eng.traces)
        rows[name] = dict(drafts=d, alpha=alpha_hat(d), rate=st.acceptance_rate, measured=st.mean_acceptance_length,
                          predicted=predicted_tokens(d, alpha_hat(d)), with_rate=predicted_tokens(d, st.acceptance_rate),
                          conditional=conditional_acceptance(d))
        r = rows[name]
        print(f"{name:16s} α̂ {r['alpha']:.2f} (rate {r['rate']:.2f}) | tokens per drafted decode: measured {r['measured']:.2f}, "
              f"formula with α̂ {r['predicted']:.2f}, formula with the rate {r['with_rate']:.2f}")
    fig = go.Figure([go.Bar(name=name, x=[f"proposal {i + 1}" for i in range(K)], y=r["conditional"]) for name, r in rows.items()])
    for name, r in rows.items():
        fig.add_hline(y=r["alpha"], line_dash="dot", annotation_text=f"α̂ {name}", annotation_position="right")
    titled(fig, "Acceptance of each proposal, given the ones before it were accepted (the i.i.d. model: one flat line)",
           clock_label="no clock: counts from the engine's step traces (n-gram proposer, k = 4)")
    fig.update_layout(barmode="group", yaxis=dict(title="P(accepted | reached)", range=[0, 1.05]), margin=dict(r=140))
    fig.show()
    viz.batch_composition_figure(runs["copy"].traces).show()
    """),
    conclusion("""
    errs = {name: abs(r["predicted"] - r["measured"]) / r["measured"] for name, r in rows.items()}
    spread = {name: max(x for x in r["conditional"] if x is not None) - min(x for x in r["conditional"] if x is not None) for name, r in rows.items()}
    bursty = max(spread, key=spread.get)
    best = min(errs, key=errs.get)
    conclude(f"With α estimated from the reached proposals, the formula predicts the tokens per drafted decode within **{max(errs.values()):.0%}** on all three "
             f"workloads (best: {best}, {rows[best]['predicted']:.2f} predicted vs {rows[best]['measured']:.2f} measured). Plugging in the reported acceptance "
             f"rate instead underestimates every one (e.g. {bursty}: {rows[bursty]['with_rate']:.2f} vs {rows[bursty]['measured']:.2f}): the rate counts "
             f"proposals that were never reached. The i.i.d. assumption itself is rough: in {bursty} the chance of accepting a proposal, given the ones "
             f"before it were accepted, ranges over **{spread[bursty]:.2f}** across positions (n-gram hits come in runs: once the text is copying, it keeps copying).",
             [("the formula with the estimated alpha is within 15 % everywhere", max(errs.values()) < 0.15),
              ("the acceptance rate is below the estimated alpha everywhere", all(r["rate"] < r["alpha"] for r in rows.values())),
              ("the formula with the rate underestimates everywhere", all(r["with_rate"] < r["measured"] for r in rows.values())),
              ("the conditional acceptance is not flat somewhere", spread[bursty] > 0.2)])
    """),
    md("""
    ## When does it pay? The price of a verify step
    A verify step of `B` requests computes `B x (1 + k)` tokens instead of `B`. While the step is memory-bound (small `B`:
    the weights and the K/V are read once whatever the token count) that is almost free; once `B x (1 + k)` passes the
    ridge point the GEMMs become compute-bound and the step costs more. With a free proposer (n-gram lookup costs no
    forward; Leviathan et al.'s `c = 0`), speculation pays when

        speedup = E[tokens per verify step] x T(B, 1) / T(B, 1 + k)   >   1

    where `T(B, n)` is the modelled time of a step of `B` requests computing `n` tokens each (1,024 tokens of context).
    """),
    code("""
    h100 = teaching_cost_model()


    def step_s(batch, tokens_per_request, context=1024):
        \"\"\"Modelled seconds of one step of `batch` requests, each computing (and sampling) `tokens_per_request` tokens.\"\"\"
        return h100.cost(StepWork.of([(tokens_per_request, context, tokens_per_request)] * batch)).time_s


    def speedup(alpha, k, batch):
        return expected_tokens(alpha, k) * step_s(batch, 1) / step_s(batch, 1 + k)


    def break_even_alpha(k, batch):
        \"\"\"The alpha at which speculation neither gains nor loses (bisection on the speedup).\"\"\"
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if speedup(mid, k, batch) > 1 else (mid, hi)
        return (lo + hi) / 2


    batches = [1, 4, 16, 32, 64, 128, 256, 512]
    fig = go.Figure([go.Scatter(x=batches, y=[break_even_alpha(k, b) for b in batches], name=f"k = {k}", mode="lines+markers") for k in (1, 2, 4, 8)])
    titled(fig, "Break-even acceptance α: speculation pays above the line")
    fig.update_layout(xaxis=dict(title="running decodes B", type="log", tickvals=batches), yaxis=dict(title="break-even α", range=[0, 1]))
    fig.show()
    for b in (1, 64, 256):
        print(f"B = {b:3d}: a 5-token verify step costs {step_s(b, 5) / step_s(b, 1):.2f}x a decode; speedup at α = 0.6, k = 4: {speedup(0.6, 4, b):.2f}x")
    """),
    conclusion("""
    be = {(k, b): break_even_alpha(k, b) for k in (1, 2, 4, 8) for b in batches}
    conclude(f"At batch 1 a 5-token verify step costs **{step_s(1, 5) / step_s(1, 1):.3f}x** a plain decode, so speculation with k = 4 pays as soon as "
             f"α > {be[4, 1]:.3f}. At batch 256 it costs {step_s(256, 5) / step_s(256, 1):.2f}x and needs **α > {be[4, 256]:.2f}**; at 512, α > {be[4, 512]:.2f}. "
             f"More proposals need a higher α at large batch (k = 8: {be[8, 256]:.2f} at batch 256) but are nearly free at batch 1 ({be[8, 1]:.3f}).",
             [("the break-even alpha rises with the batch", all(be[4, a] <= be[4, b] for a, b in zip(batches, batches[1:]))),
              ("at batch 1 almost any acceptance pays", be[4, 1] < 0.05),
              ("at batch 256 it takes a substantial acceptance", be[4, 256] > 0.2),
              ("longer drafts need more acceptance at large batch", be[8, 256] > be[4, 256] > be[1, 256])])
    """),
    md("""
    ### On the engine: where it pays and where it does not
    The same two questions on the real engine, on the modelled clock: the copy workload at a small batch (high α,
    memory-bound steps) and the random sampled workload at a large batch (low α, steps near the ridge point), each run
    with speculation off and on. Outputs are checked identical for the greedy run (verification is exact) and for the
    seeded sampled run (the engine samples a verified position with the same seeded generator).
    """),
    code("""
    BIG = pick(128, 64)
    cases = {"copy, batch 4": ([copy_prompt() for _ in range(4)], [greedy] * 4),
             f"random sampled, batch {BIG}": ([random_prompt() for _ in range(BIG)],
                                              [SamplingParams(temperature=1.0, seed=i, max_tokens=pick(24, 16), ignore_eos=True) for i in range(BIG)])}
    paid = {}
    for name, (prompts, params) in cases.items():
        (off, off_out), (on, on_out) = serve(prompts, params, None), serve(prompts, params, SPEC)
        so, sn = off.summary(), on.summary()
        same = all(off_out[r].outputs[0].token_ids == on_out[r].outputs[0].token_ids for r in off_out)
        paid[name] = dict(off_s=so.duration_s, on_s=sn.duration_s, rate=sn.spec_acceptance_rate, alpha=alpha_hat(drafts_of(on)) if drafts_of(on) else 0.0,
                          proposed=sn.spec_draft_tokens, accepted=sn.spec_accepted_tokens, same=same, steps=(so.num_steps, sn.num_steps))
        p = paid[name]
        print(f"{name:26s} modelled {p['off_s'] * 1e3:7.1f} ms off, {p['on_s'] * 1e3:7.1f} ms on ({p['off_s'] / p['on_s']:.2f}x) | steps {p['steps'][0]} -> {p['steps'][1]} "
              f"| accepted {p['accepted']} of {p['proposed']} (α̂ {p['alpha']:.2f}) | same tokens: {same}")
    """),
    conclusion("""
    (small_name, small), (big_name, big) = paid.items()
    conclude(f"**{small_name}**: accepted {small['accepted']} of {small['proposed']} proposals, the modelled run took {small['on_s'] * 1e3:.0f} ms instead of "
             f"{small['off_s'] * 1e3:.0f} ms (**{small['off_s'] / small['on_s']:.2f}x**). **{big_name}**: {big['accepted']} of {big['proposed']} accepted, "
             f"{big['on_s'] * 1e3:.0f} ms instead of {big['off_s'] * 1e3:.0f} ms (**{big['off_s'] / big['on_s']:.3f}x**): the rejected proposals were paid for in "
             f"steps that were no longer almost free. Both produced exactly the tokens of the run without speculation.",
             [("speculation pays on the small, repetitive batch", small["on_s"] < small["off_s"]),
              ("it costs time on the large batch with rare acceptance", big["on_s"] > big["off_s"]),
              ("acceptance is lower on the large sampled batch", big["rate"] < small["rate"]),
              ("outputs are unchanged", small["same"] and big["same"])])
    """),
    md("## Try it: α, k and the batch"),
    code("""
    import ipywidgets as widgets


    def pays(alpha=0.6, k=4, batch=16):
        s = speedup(alpha, k, batch)
        print(f"α = {alpha}, k = {k}, batch {batch}: {expected_tokens(alpha, k):.2f} tokens per verify step, a verify step costs "
              f"{step_s(batch, 1 + k) / step_s(batch, 1):.2f}x a decode -> {s:.2f}x ({'pays' if s > 1 else 'does not pay'}); break-even α {break_even_alpha(k, batch):.2f}")
        fig = go.Figure(go.Scatter(x=list(range(1, 11)), y=[speedup(alpha, kk, batch) for kk in range(1, 11)], mode="lines+markers"))
        fig.add_hline(y=1, line_dash="dash")
        titled(fig, f"Modelled speedup vs proposals k (α = {alpha}, batch {batch})")
        fig.update_layout(xaxis_title="proposals per step k", yaxis_title="speedup per step")
        fig.show()


    widgets.interact_manual(pays, alpha=widgets.FloatSlider(value=0.6, min=0.05, max=0.95, step=0.05), k=widgets.IntSlider(value=4, min=1, max=10),
                            batch=widgets.SelectionSlider(options=[1, 4, 16, 64, 128, 256, 512], value=16))
    """),
    *exercise(1, """
        Write `answer_1(alpha, k)`: the expected tokens a verify step yields when each of `k` proposals is accepted with
        probability `alpha` until the first rejection. The check computes it from the distribution of the number accepted
        (`j` with probability `alpha^j (1 - alpha)` for `j < k`, `alpha^k` for `j = k`) on several `(alpha, k)`, `alpha = 1` (a draft the target always accepts) among them, rounded to 6 decimals.
        """, "The step yields at least i + 1 tokens when the first i proposals are accepted.", "answer_1",
        "answer_1 = lambda alpha, k: sum(alpha ** i for i in range(k + 1))  # the closed form (1 - alpha^(k+1)) / (1 - alpha) divides by zero at alpha = 1",
        """
        def from_distribution(alpha, k):
            probs = [alpha ** j * (1 - alpha) for j in range(k)] + [alpha ** k]
            return round(sum(p * (j + 1) for j, p in enumerate(probs)), 6)

        rounded = answer_1 if not callable(answer_1) else (lambda a, k: round(answer_1(a, k), 6))
        check_function("Exercise 1: tokens per verify step", rounded, [((a, k), from_distribution(a, k)) for a, k in ((0.5, 4), (0.8, 1), (0.9, 8), (0.3, 3), (0.0, 5), (1.0, 4))])
        """, wrong=["answer_1 = lambda alpha, k: (1 - alpha ** (k + 1)) / (1 - alpha)  # right, except at alpha = 1 (a perfect draft): 0 / 0",
                    "answer_1 = lambda alpha, k: (1 - alpha ** k) / (1 - alpha)  # forgot the target's own token after the accepted run",
                    "answer_1 = lambda alpha, k: 1 + k * alpha  # a proposal counts only if all before it were accepted",
                    "answer_1 = lambda alpha, k: 1 / (1 - alpha)  # k proposals, not infinitely many",
                    "answer_1 = lambda alpha, k: k * alpha  # the step always yields at least one token"]),
    *exercise(2, """
        Write `answer_2(drafts)`: the estimate of α from a list of `(proposed, accepted)` drafts, counting only the
        proposals that were reached (each accepted one, and the first rejected one when `accepted < proposed`). The check
        uses the drafts of the three runs above and two small hand-made lists.
        """, "A draft with a accepted of k contributes a successes, and one failure if a < k.", "answer_2",
        "answer_2 = lambda drafts: sum(a for k, a in drafts) / (sum(a for k, a in drafts) + sum(1 for k, a in drafts if a < k))",
        """
        class Drafts(list):
            def __init__(self, name, items):
                super().__init__(items)
                self.name = name

            def __repr__(self):
                return f"<drafts: {self.name}>"

        samples = [Drafts(name, r["drafts"]) for name, r in rows.items()] + [Drafts("hand-made 1", [(4, 4), (4, 0), (2, 1)]),
                                                                             Drafts("hand-made 2", [(3, 3), (3, 3), (1, 0), (4, 2)])]
        rounded = answer_2 if not callable(answer_2) else (lambda d: round(answer_2(d), 6))
        check_function("Exercise 2: estimating alpha", rounded, [(d, round(alpha_hat(d), 6)) for d in samples])
        """, wrong=["answer_2 = lambda drafts: sum(a for k, a in drafts) / sum(k for k, a in drafts)  # the acceptance rate counts proposals never reached",
                    "answer_2 = lambda drafts: sum(a for k, a in drafts) / (sum(a for k, a in drafts) + len(drafts))  # a draft with all accepted had no failure",
                    "answer_2 = lambda drafts: sum(a / k for k, a in drafts) / len(drafts)  # a mean of per-draft rates, same flaw"]),
    *exercise(3, """
        Write `answer_3(alpha, k, batch)`: the modelled speedup per step of speculation with a free proposer, using
        `expected_tokens` and `step_s(batch, tokens_per_request)` from above. The check compares it (rounded to 3
        decimals) with the chapter's own speedup on several batches, α and k.
        """, "Tokens per verify step, times the price of a plain decode step over the price of a verify step of 1 + k tokens.", "answer_3",
        "answer_3 = lambda alpha, k, batch: expected_tokens(alpha, k) * step_s(batch, 1) / step_s(batch, 1 + k)",
        """
        rounded = answer_3 if not callable(answer_3) else (lambda a, k, b: round(answer_3(a, k, b), 3))
        check_function("Exercise 3: modelled speedup", rounded, [((a, k, b), round(speedup(a, k, b), 3)) for a, k, b in ((0.6, 4, 1), (0.6, 4, 256), (0.3, 8, 128), (0.9, 2, 64))])
        """, wrong=["answer_3 = lambda alpha, k, batch: expected_tokens(alpha, k)  # the verify step is not free at large batch",
                    "answer_3 = lambda alpha, k, batch: expected_tokens(alpha, k) * step_s(batch, 1) / step_s(batch, k)  # the decode's own token is computed too",
                    "answer_3 = lambda alpha, k, batch: expected_tokens(alpha, k) * step_s(1, 1) / step_s(1, 1 + k)  # the price depends on the batch"]),
    *question("why is the reported acceptance rate not the α of the formula?", """
        vLLM and this engine report accepted / proposed. Why does plugging it into (1 - α^(k+1)) / (1 - α) underestimate
        the tokens per step?
        """, """
        The formula's α is the chance that a proposal is accepted *given that it is reached*, i.e. that all proposals before
        it were accepted. Verification stops at the first rejection, so proposals after it are not judged, yet the rate
        counts them in its denominator as if they had been rejected. With k = 4 a draft rejected at its first proposal adds
        4 to the denominator and 0 to the numerator, while the formula's model saw one failure. So the rate is always below α (unless no draft stops early) (checked: the acceptance rate is below the estimated alpha everywhere), and the formula fed with it predicts too few tokens.
        """),
    *question("what if the proposer were a draft model costing c of a target forward?", """
        The n-gram proposer costs nothing on the GPU. How does the break-even change with a small draft model whose forward
        costs a fraction c of the target's?
        """, """
        The draft runs k forwards per step (one per proposal, autoregressively), so a verify step now costs
        `T(B, 1 + k) + k c T(B, 1)` instead of `T(B, 1 + k)`; at small batch Leviathan et al.'s improvement factor is
        `(1 - α^(k+1)) / ((1 - α)(k c + 1))`. With c = 0.05 and k = 4 the draft adds 20 % to every step, so α must be
        noticeably higher to pay, and the best k is smaller: each extra proposal now has a price even when the target's
        step is memory-bound (Leviathan et al., ICML 2023). At large batch the break-even α rises with the batch
        (checked: the break-even alpha rises with the batch), and the draft's cost comes on top.
        """),
    *question("why does speculation stop paying at large batch, even with a perfect proposer?", """
        Suppose α = 1. Is speculation still free at batch 512?
        """, """
        With α = 1 every step yields k + 1 tokens, so the work per generated token is the same as without speculation: the
        step just computes k + 1 tokens per request at once. At small batch that still wins, because one weight read serves
        k + 1 tokens instead of one (decode is memory-bound) (checked: speculation pays on the small, repetitive batch). At large batch the step is already compute-bound: k + 1 times
        the tokens costs close to k + 1 times the time, so even perfect proposals give little, and any rejection costs. That
        is why serving systems switch speculation off, or shorten k, as the load grows (source: vLLM's
        `speculative_disable_by_batch_size` engine argument).
        """),
    *summary([
        "Verification keeps proposals up to the first rejection and adds one token of the target's own: 1 to k + 1 tokens per forward.",
        "With each proposal accepted with probability α independently, a verify step yields (1 - α^(k+1)) / (1 - α) tokens on average (Leviathan et al. 2023); returns diminish with k.",
        "Estimate α from the reached proposals (successes over successes plus first failures); the reported acceptance rate (accepted / proposed) is lower and is not the formula's α (checked: the acceptance rate is below the estimated alpha everywhere).",
        "Measured n-gram acceptance is bursty (the i.i.d. model is an approximation), yet the formula with the estimated α predicts the tokens per drafted decode closely.",
        "Speculation pays when verifying 1 + k tokens costs about as much as one (small batch, memory-bound); at large batch the break-even α rises and low acceptance makes it slower (checked: the break-even alpha rises with the batch; it costs time on the large batch with rare acceptance).",
    ]),
    *glossary([
        ("speculative decoding", "投机解码", "guess several tokens, verify them in one forward, keep the accepted ones"),
        ("proposal / draft", "候选 / 草稿", "the tokens a proposer guesses for one request in one step"),
        ("acceptance rate", "接受率", "accepted / proposed tokens (what engines report)"),
        ("α (per-token acceptance)", "单词元接受概率 α", "the chance a reached proposal is accepted (the formula's parameter)"),
        ("verify step", "验证步", "one target forward over a request's pending token plus its k proposals"),
        ("bonus token", "额外词元", "the target's own token after k accepted proposals"),
        ("break-even", "盈亏平衡点", "the α at which speculation neither gains nor loses time"),
        ("prompt lookup (n-gram)", "提示查找（n-gram）", "proposing what followed the request's last n-gram earlier in its text"),
    ]),
]
