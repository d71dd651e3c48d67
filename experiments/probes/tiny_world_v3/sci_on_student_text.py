"""Why forward KL on the student's own rollouts wrecks v3's knowledge student (v3_sci, mix 0): what
teacher-sci's distribution looks like on student-sci's T=1 text, against its own T=1 text, on 200
fixed tinysci questions; and, for the start and each distilled student given, the share of greedy
answers that name an option at all (an answer that is not an option scores 0, below chance).
Usage: sci_on_student_text.py WORLD_DIR [STUDENT_DIR...]   (LOG 2026-12-04, twentieth session)"""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import qa
from distill.tasks.registry import get_task

torch.set_num_threads(2)
world, students = Path(sys.argv[1]), sys.argv[2:]
task = get_task("tinysci")
rows = task.rows(200, seed=12345)


def load(path):
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()


def samples(tok, model, seed):
    """One T=1 completion (token ids, EOS included) per question."""
    torch.manual_seed(seed)
    out = []
    with torch.no_grad():
        for row in rows:
            ids = tok(row["prompt"], return_tensors="pt").input_ids
            gen = model.generate(ids, max_new_tokens=64, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
            out.append((ids[0], gen[0, ids.shape[1] :]))
    return out


def teacher_view(model, pairs):
    """The teacher's mean next-token entropy and NLL (nats) over the completion tokens."""
    ent = nll = n = 0.0
    with torch.no_grad():
        for prompt, completion in pairs:
            ids = torch.cat([prompt, completion])[None]
            logp = model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
            ent += -(logp.exp() * logp).sum(-1).sum().item()
            nll += -logp.gather(-1, completion[:, None]).sum().item()
            n += len(completion)
    return ent / n, nll / n


t_tok, teacher = load(world / "teacher-sci")
s_tok, student = load(world / "student-sci")
for name, (tok, model) in {"student-sci": (s_tok, student), "teacher-sci": (t_tok, teacher)}.items():
    pairs = samples(tok, model, seed=0)
    texts = [tok.decode(c, skip_special_tokens=True) for _, c in pairs]
    named = sum(qa.extract(t, r["options"]) is not None for t, r in zip(texts, rows)) / len(rows)
    ent, nll = teacher_view(teacher, pairs)
    print(
        f"{name} T=1 text: teacher-sci entropy {ent:.3f} nats/token, NLL {nll:.3f}; answers naming an option {named:.3f}"
    )
for path in [str(world / "student-sci"), *students]:
    tok, model = load(path)
    texts = greedy_completions(model, tok, [r["prompt"] for r in rows], 64)
    named = sum(qa.extract(t, r["options"]) is not None for t, r in zip(texts, rows)) / len(rows)
    right = sum(task.score(t, r) for t, r in zip(texts, rows)) / len(rows)
    print(f"{path}: greedy accuracy {right:.3f}, answers naming an option {named:.3f}")
