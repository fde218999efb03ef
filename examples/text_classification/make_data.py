"""Write the example's data: short film reviews, each labelled positive, negative or neutral.

    python -m examples.text_classification.make_data                 # examples/text_classification/reviews.tsv
    python -m examples.text_classification.make_data --lines 5000 --output /tmp/more.tsv

A review is one to three sentences about a film; the opinion words of most of its sentences decide the
label, the rest is filler.
The same arguments write the same bytes (tests/unit/test_example.py checks the committed file against them).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

OPINIONS = {
    "positive": ["great", "wonderful", "superb", "moving", "brilliant", "charming", "gripping", "delightful"],
    "negative": ["awful", "dull", "clumsy", "tedious", "dreadful", "shallow", "bland", "grating"],
    "neutral": ["average", "ordinary", "long", "familiar", "quiet", "conventional", "modest", "plain"],
}
SUBJECTS = ["the film", "the plot", "the acting", "the score", "the ending", "the script", "the cast", "the pacing",
            "the camera work", "the dialogue"]
TEMPLATES = ["{subject} was {word}", "i found {subject} {word}", "{subject} felt {word} from start to finish",
             "honestly {subject} is {word}", "{subject} seemed {word} to me", "all in all {subject} was {word}"]
DEFAULT_OUTPUT = Path(__file__).with_name("reviews.tsv")


def review(label: str, rng: random.Random) -> str:
    """One to three sentences of the label's opinion; in a review of three, one sentence may say another
    (the label is the review's majority), so a word or two does not give the label away."""
    opinions = [label] * rng.randint(1, 3)
    if len(opinions) == 3 and rng.random() < 0.5:
        opinions[rng.randrange(3)] = rng.choice([other for other in OPINIONS if other != label])
    return " . ".join(rng.choice(TEMPLATES).format(subject=rng.choice(SUBJECTS), word=rng.choice(OPINIONS[opinion]))
                      for opinion in opinions)


def write_reviews(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    labels = sorted(OPINIONS)
    rows = [(label := rng.choice(labels), review(label, rng)) for _ in range(lines)]
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1200, help="reviews to write (default 1200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    write_reviews(args.output, args.lines, args.seed)
    print(args.output)


if __name__ == "__main__":
    main()
