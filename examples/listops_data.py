"""LRA ListOps: a seeded generator of nested list-operation expressions and their evaluator.

ListOps (Nangia & Bowman 2018) in its Long Range Arena variant (Tay et al. 2021):
an expression is a tree of operators over the digits 0-9, written in prefix form
with a closing bracket per operator, e.g.

    [MAX 2 9 [MIN 4 7 ] 0 ]                                  -> 9

and the task is its value, a digit (10 classes). Operators: MAX, MIN, MED (the
median, rounded down when it falls between two digits, as LRA's
`int(np.median(args))`) and SM (the sum modulo 10). As in LRA's generator, every
node is an operator with probability `operator_probability` (a digit otherwise;
always a digit at `max_depth`), takes 2 to `max_args` arguments, and only
expressions whose token count lies in [min_length, max_length] are kept. The
defaults are depth <= 10, at most 5 arguments and 500-2000 tokens; LRA's own
script (lra_benchmarks/data/listops.py) draws up to 10 arguments with operator
probability 0.25, which `max_args=10, operator_probability=0.25` reproduces. LRA
writes the trees with extra parentheses that its input pipeline strips; the
expressions here are already in that stripped form, one token per whitespace-
separated word, so the token count is the sequence length the model sees.

The generator is deterministic: the same arguments and seed give the same
expressions on every platform (Python's `random.Random` with a string seed).
"""

import random

MAX, MIN, MED, SUM_MOD = "[MAX", "[MIN", "[MED", "[SM"
OPERATORS = (MAX, MIN, MED, SUM_MOD)
END = "]"
DIGITS = tuple(str(d) for d in range(10))
VOCABULARY = OPERATORS + (END,) + DIGITS
NUM_CLASSES = 10


def apply_operator(operator, args):
    """The value of `operator` on the digits `args`."""
    if operator == MAX:
        return max(args)
    if operator == MIN:
        return min(args)
    if operator == MED:
        ordered = sorted(args)
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2
    if operator == SUM_MOD:
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {operator!r}; expected one of {OPERATORS}")


def evaluate(expression):
    """The value (0-9) of a ListOps expression string, with an explicit stack (no recursion)."""
    operators, arguments = [], [[]]
    for token in expression.split():
        if token in OPERATORS:
            operators.append(token)
            arguments.append([])
        elif token == END:
            if not operators:
                raise ValueError(f"unbalanced {END!r} in ListOps expression: {expression[:80]!r}")
            args = arguments.pop()
            arguments[-1].append(apply_operator(operators.pop(), args))
        elif token in DIGITS:
            arguments[-1].append(int(token))
        else:
            raise ValueError(f"unknown ListOps token {token!r}; expected one of {VOCABULARY}")
    if operators or len(arguments[0]) != 1:
        raise ValueError(f"incomplete ListOps expression: {expression[:80]!r}")
    return arguments[0][0]


def _random_tree(rng, depth, max_depth, max_args, operator_probability, tokens):
    """Appends a random subtree's tokens to `tokens`."""
    if depth < max_depth and rng.random() < operator_probability:
        tokens.append(rng.choice(OPERATORS))
        for _ in range(rng.randint(2, max_args)):
            _random_tree(rng, depth + 1, max_depth, max_args, operator_probability, tokens)
        tokens.append(END)
    else:
        tokens.append(rng.choice(DIGITS))


def _full_tree_length(max_depth, num_args):
    """Token count of the tree whose nodes above max_depth are all operators with num_args arguments."""
    tokens = 1
    for _ in range(max_depth - 1):
        tokens = 2 + num_args * tokens
    return tokens


def generate_expressions(num_examples, seed, min_length=500, max_length=2000, max_depth=10, max_args=5,
                         operator_probability=0.47):
    """`num_examples` expression strings with token counts in [min_length, max_length], and their values.

    Args:
        num_examples: How many expressions.
        seed: An int or str; the same seed gives the same expressions.
        min_length, max_length: Bounds on the number of tokens (LRA: 500 and 2000).
        max_depth: Operators nest at most `max_depth - 1` deep; digits sit at depth <= max_depth.
        max_args: Arguments per operator, drawn uniformly from [2, max_args].
        operator_probability: Probability that a node above `max_depth` is an operator. LRA's
            script uses 0.25 with up to 10 arguments (median length of the kept expressions about
            940 tokens); with up to 5 arguments, 0.47 gives about the same lengths (median about
            930, 10%-90% 575-1590 tokens), and about one draw in five is kept.

    Returns:
        (expressions, labels): a list of str and a list of int in [0, 9].
    """
    if not 1 <= min_length <= max_length:
        raise ValueError(f"expected 1 <= min_length <= max_length, got min_length={min_length}, "
                         f"max_length={max_length}")
    if not 0.0 <= operator_probability <= 1.0:
        raise ValueError(f"expected operator_probability in [0, 1], got {operator_probability}")
    if max_args < 2 or max_depth < 1:
        raise ValueError(f"expected max_args >= 2 and max_depth >= 1, got max_args={max_args}, "
                         f"max_depth={max_depth}")
    # Lengths the generator can produce; a window outside them would make the loop below endless.
    shortest = 1 if operator_probability < 1 else _full_tree_length(max_depth, 2)
    longest = _full_tree_length(max_depth, max_args) if operator_probability > 0 else 1
    if min_length > longest or max_length < shortest:
        raise ValueError(f"lengths [{min_length}, {max_length}] are unreachable: with max_depth={max_depth}, "
                         f"max_args={max_args} and operator_probability={operator_probability} expressions "
                         f"have {shortest} to {longest} tokens")
    rng = random.Random(f"listops/{seed}")
    expressions, labels = [], []
    while len(expressions) < num_examples:
        tokens = []
        _random_tree(rng, 1, max_depth, max_args, operator_probability, tokens)
        if min_length <= len(tokens) <= max_length:
            expression = " ".join(tokens)
            expressions.append(expression)
            labels.append(evaluate(expression))
    return expressions, labels
