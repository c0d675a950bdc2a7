"""Train minengine's bundled tiny model on Tiny Shakespeare.

Trains a byte-level BPE tokenizer (``tokenizers``, vocabulary 2,048) and a
``transformers`` ``LlamaForCausalLM`` (grouped-query attention, RoPE, RMSNorm,
SwiGLU) on the first 90 % of ``../shared/data/text/tinyshakespeare.txt``,
validates on the last 10 %, and saves both with ``save_pretrained`` into
``minengine/assets/tiny-shakespeare-llama`` together with a model card.

Run from the repository root (one CPU thread, about 15 minutes)::

    python scripts/train_tiny_model.py

Everything is seeded, so the same command gives the same weights on the same
machine and library versions.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "text" / "tinyshakespeare.txt"
DEFAULT_OUT = ROOT / "minengine" / "assets" / "tiny-shakespeare-llama"
EOS = "<|endoftext|>"


# The chat template: speaker lines as in the training text ("NAME:\n<speech>\n\n"), so /v1/chat/completions and
# LLM.chat work on this model. A message's "name" is its speaker; otherwise the user speaks as ROMEO and the
# assistant as JULIET; a system message is plain text before the dialogue.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}{%- if message['role'] == 'system' -%}{{ message['content'] }}"
    "{{ '\\n\\n' }}{%- else -%}{%- if message.name -%}{%- set speaker = message.name | upper -%}"
    "{%- elif message['role'] == 'user' -%}{%- set speaker = 'ROMEO' -%}"
    "{%- elif message['role'] == 'assistant' -%}{%- set speaker = 'JULIET' -%}{%- else -%}"
    "{%- set speaker = message['role'] | upper -%}{%- endif -%}{{ speaker }}:{{ '\\n' }}"
    "{{ message['content'] }}{{ '\\n\\n' }}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}"
    "JULIET:{{ '\\n' }}{%- endif -%}"
)


def train_tokenizer(text: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) trained on ``text``; returns an HF fast tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([text], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None,
                                   pad_token=EOS, clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE)


def write_model_card(out: Path, sample: str | None = None) -> None:
    """README.md for the model folder, from its config.json and training_stats.json."""
    cfg = json.loads((out / "config.json").read_text())
    st = json.loads((out / "training_stats.json").read_text())
    size_kb = sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1024
    rows = "\n".join(f"| {h['step']} | {h['train_loss']:.3f} | {h['val_loss']:.3f} |" for h in st["history"])
    heads = f"{cfg['num_attention_heads']} query heads, {cfg['num_key_value_heads']} KV heads (grouped-query)"
    rope = f"RoPE (theta {cfg['rope_parameters']['rope_theta']:g})"
    card = f"""# tiny-shakespeare-llama

minengine's bundled model: a tiny Llama trained from scratch on Tiny Shakespeare by
`scripts/train_tiny_model.py`, so that the engine, the course and the dashboard serve a real trained model
on a laptop CPU with no download.

## Architecture (transformers `LlamaForCausalLM`)
| | |
|---|---|
| parameters | {st['parameters']:,} (tied input/output embeddings) |
| layers | {cfg['num_hidden_layers']} |
| hidden size | {cfg['hidden_size']} |
| attention | {heads}, head dim {cfg['head_dim']} |
| MLP | SwiGLU, intermediate size {cfg['intermediate_size']} |
| positions | {rope}, `max_position_embeddings` {cfg['max_position_embeddings']} |
| norm | RMSNorm, eps {cfg['rms_norm_eps']} |
| vocabulary | {cfg['vocab_size']} (byte-level BPE trained with `tokenizers`; `<|endoftext|>` is BOS/EOS/pad) |
| weights on disk | bfloat16 safetensors ({size_kb / 1024:.1f} MiB folder); load in float32 for exact comparisons |

## Training
- Data: `../shared/data/text/tinyshakespeare.txt` (karpathy/char-rnn), first 90 % train
  ({st['train_tokens']:,} tokens), last 10 % validation ({st['val_tokens']:,} tokens).
- Command: `python scripts/train_tiny_model.py` (seed {st['seed']}, {st['steps']} steps, batch {st['batch_size']} x
  {st['seq_len']} tokens, AdamW lr {st['lr']} with warm-up and cosine decay, weight decay 0.1, 1 CPU thread,
  {st['minutes']} minutes on a shared 2-core machine, torch {st['torch']}).
- Final loss (mean cross-entropy, nats/token over 256 windows): train **{st['final_train_loss']:.3f}**,
  validation **{st['final_val_loss']:.3f}**.

| step | train loss (that batch) | validation loss (first 64 windows) |
|---:|---:|---:|
{rows}
"""
    if sample:
        card += f"""
## Samples (minengine, float32; `LLM().generate(prompt, SamplingParams(...))`)
```
{sample}
```
"""
    card += """
## Use
```python
from minengine import LLM, SamplingParams
llm = LLM()  # this model
print(llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text)
# chat: the tokenizer's chat template writes speaker lines (user = ROMEO, assistant = JULIET, or a message's name)
(reply,) = llm.chat([{"role": "user", "content": "Good morrow."}], SamplingParams(temperature=0, stop=["\\n\\n"]))
print(reply.outputs[0].text)

from transformers import AutoModelForCausalLM, AutoTokenizer  # plain transformers works too
model = AutoModelForCausalLM.from_pretrained("minengine/assets/tiny-shakespeare-llama")
tokenizer = AutoTokenizer.from_pretrained("minengine/assets/tiny-shakespeare-llama")
```
Trained on public-domain text; it writes Shakespeare-flavoured text and knows nothing else.
"""
    (out / "README.md").write_text(card)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=192)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)  # 1 thread: reproducible sums
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    text = args.data.read_text(encoding="utf-8")
    split = int(len(text) * 0.9)
    train_text, val_text = text[:split], text[split:]

    tokenizer = train_tokenizer(train_text, vocab_size=2048)
    train_ids = torch.tensor(tokenizer(train_text)["input_ids"], dtype=torch.long)
    val_ids = torch.tensor(tokenizer(val_text)["input_ids"], dtype=torch.long)
    print(f"tokens: train {len(train_ids):,}  val {len(val_ids):,}  vocab {len(tokenizer)}")

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params:,}")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 50

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)

    def batch(ids: torch.Tensor) -> torch.Tensor:
        starts = torch.randint(0, len(ids) - args.seq_len - 1, (args.batch_size,), generator=gen)
        return torch.stack([ids[s:s + args.seq_len + 1] for s in starts.tolist()])

    @torch.no_grad()
    def evaluate(ids: torch.Tensor, n_windows: int = 64) -> float:
        model.eval()
        losses = []
        for s in range(0, min(len(ids) - args.seq_len - 1, n_windows * args.seq_len), args.seq_len):
            x = ids[s:s + args.seq_len + 1].unsqueeze(0)
            losses.append(model(input_ids=x, labels=x).loss.item())
        model.train()
        return sum(losses) / len(losses)

    history = []
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x = batch(train_ids)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            val = evaluate(val_ids)
            history.append({"step": step, "train_loss": round(loss.item(), 4), "val_loss": round(val, 4),
                            "elapsed_s": round(time.time() - t0, 1)})
            print(history[-1], flush=True)

    train_loss = evaluate(train_ids, n_windows=256)
    val_loss = evaluate(val_ids, n_windows=256)
    minutes = (time.time() - t0) / 60
    print(f"final: train {train_loss:.4f} val {val_loss:.4f} in {minutes:.1f} min")

    args.out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)  # bf16 on disk keeps the repo small
    tokenizer.save_pretrained(args.out)
    stats = {"parameters": n_params, "steps": args.steps, "batch_size": args.batch_size,
             "seq_len": args.seq_len, "lr": args.lr, "seed": args.seed,
             "train_tokens": len(train_ids), "val_tokens": len(val_ids),
             "final_train_loss": round(train_loss, 4), "final_val_loss": round(val_loss, 4),
             "minutes": round(minutes, 1), "history": history,
             "torch": torch.__version__}
    (args.out / "training_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    write_model_card(args.out)


if __name__ == "__main__":
    main()
