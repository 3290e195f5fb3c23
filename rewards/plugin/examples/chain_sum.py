"""The built-in chain-sum reward as a Python file: 1 for the right final answer, 0 otherwise.

    [reward]
    kind = "python"
    path = "rewards/plugin/examples/chain_sum.py"

`compute_score` has verl's signature. The completion ends `>16` for the prompt `a5b8c3=`; the
reference is the task's: {"terms": [5, 8, 3], "answer": 16}.
"""

DIGITS = set("0123456789")


def final_answer(text):
    """The digits after the last `>`, or None."""
    if ">" not in text:
        return None
    tail = text.rpartition(">")[2].strip()
    if not tail or len(tail) > 18 or not set(tail) <= DIGITS:
        return None
    return int(tail)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    got = final_answer(solution_str)
    if got is None:
        return {"score": 0.0, "verdict": "no_answer"}
    if got == ground_truth["answer"]:
        return {"score": 1.0, "answer": got}
    return {"score": 0.0, "answer": got}
