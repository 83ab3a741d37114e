#!/usr/bin/env python3
"""`semflow perplexity` on stories260K (a trained Llama-2 model) with the CPU backend: a story
in its style scores low, the same words shuffled far higher and the model's own greedy text
lower still; the figure does not depend on how the windows are batched (one window and one
scored position a step against 16 and 512); bad arguments and files get exit 2 and a message."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from sftest import BIN, DATA, check, results  # noqa: E402


def test_data(rel):
    return os.path.join(DATA, rel)

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, "
         "she saw a big red ball. She wanted to play with it, but it was too high. Lily asked her mom to help her. "
         "Her mom said, \"Let's go to the park and play with the ball.\" Lily was so happy. They played with the "
         "ball all day long. When it was time to go home, Lily said, \"Thank you, mom. I love you.\" Her mom smiled "
         "and gave her a big hug. Once upon a time, there was a little boy named Tom. He had a dog named Max. Max "
         "was a good dog. He liked to run and jump. One day, Tom and Max went to the park. They saw a big tree. Tom "
         "wanted to climb the tree, but he was scared. Max barked and wagged his tail. Tom felt brave and climbed "
         "the tree. He was very happy. The sun was shining and the birds were singing. Tom and Max played all day. "
         "At night, they went home and slept. The end.\n")


def ppl(model, path, *extra):
    r = subprocess.run([BIN, "perplexity", "--model", model, "--file", path, "--threads", "1", "--json"] + list(extra),
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        return None, r
    return json.loads(r.stdout.strip().splitlines()[-1]), r


def main():
    model = test_data("stories260K/stories260K.gguf")
    d = tempfile.mkdtemp()
    files = {}
    words = STORY.split()
    shuffled = [words[(i * 37) % len(words)] for i in range(len(words))]  # a fixed permutation (37 is coprime)
    for name, text in (("story", STORY), ("shuffled", " ".join(shuffled) + "\n"),
                       ("greedy", open(test_data("stories260K/expected_greedy_t0_256steps.txt")).read())):
        files[name] = os.path.join(d, name + ".txt")
        with open(files[name], "w") as f:
            f.write(text)
    story, r = ppl(model, files["story"], "--ctx", "64")
    check("perplexity_runs", story is not None and story["windows"] >= 4 and story["tokens_scored"] == 32 * story["windows"],
          r.stderr[-400:] if story is None else story)
    if story is None:
        return 1
    shuf, _ = ppl(model, files["shuffled"], "--ctx", "64")
    greedy, _ = ppl(model, files["greedy"], "--ctx", "64")
    check("perplexity_story_low", 1 < story["perplexity"] < 10, story)
    check("perplexity_shuffled_high", shuf and shuf["perplexity"] > 5 * story["perplexity"], shuf)
    check("perplexity_own_greedy_lower", greedy and greedy["perplexity"] < story["perplexity"], greedy)
    one, _ = ppl(model, files["story"], "--ctx", "64", "--max-num-seqs", "1", "--max-logit-rows", "1")
    check("perplexity_batching_invariant", one and abs(one["nll_mean"] - story["nll_mean"]) < 1e-4,
          (one, story["nll_mean"]))
    human = subprocess.run([BIN, "perplexity", "--model", model, "--file", files["story"], "--ctx", "64", "--threads", "1"],
                           capture_output=True, text=True, timeout=300)
    check("perplexity_text_output", human.returncode == 0 and "[1]" in human.stdout and
          ("perplexity %.4f" % story["perplexity"]) in human.stdout and
          human.stdout.strip().splitlines()[-1].startswith("Final estimate: PPL = %.4f +/- " % story["perplexity"]),
          human.stdout[-300:])

    bad_utf8 = os.path.join(d, "bad.txt")
    with open(bad_utf8, "wb") as f:
        f.write(b"Once upon a time \xff\xfe there was")
    for name, args, want in (("missing_file", ["--file", os.path.join(d, "none.txt")], "none.txt"),
                             ("too_short", ["--file", files["story"], "--ctx", "4096"], "lower --ctx"),
                             ("invalid_utf8", ["--file", bad_utf8, "--ctx", "8"], "tokenizing"),
                             ("ctx_out_of_range", ["--file", files["story"], "--ctx", "2"], "--ctx"),
                             ("no_file", [], "--file is required"),
                             ("logit_rows_zero", ["--file", files["story"], "--max-logit-rows", "0"], "--max-logit-rows"),
                             ("backend_unknown", ["--file", files["story"], "--backend", "gpu"], "use auto, cpu or cuda")):
        r = subprocess.run([BIN, "perplexity", "--model", model, "--threads", "1"] + args, capture_output=True,
                           text=True, timeout=120)
        check("perplexity_" + name, r.returncode == 2 and want in r.stderr, (r.returncode, r.stderr[-300:]))
    r = subprocess.run([BIN, "serve", "--model", "demo", "--max-logit-rows", "0"], capture_output=True, text=True,
                       timeout=60)
    check("serve_max_logit_rows_zero", r.returncode == 2 and "--max-logit-rows" in r.stderr, (r.returncode, r.stderr[-300:]))
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
