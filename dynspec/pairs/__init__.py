"""Test and benchmark model pairs, kept out of the serving code: `tiny_pair` trains the embedded
tiny target + EAGLE-3 draft, `random_pair` writes random-weight pairs of a real shape, `corpus`
is the tiny pair's text (its recorded train/held-out split and the prompts drawn from it)."""
