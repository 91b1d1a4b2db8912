"""lm-evaluation-harness glue of ``bundled-lastword``: its documents and its per-example metrics."""


def load(**kwargs):
    """{"test": Dataset} of every example (lm-eval passes the task's metadata as keyword arguments)."""
    import datasets

    from ghosted.evaluation.lastword import examples

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(examples())})


def process_results(doc, results):
    """Greedy accuracy and the target's log-likelihood of one example (lm-eval's (ll, is_greedy))."""
    loglikelihood, is_greedy = results[0]
    return {"acc": int(is_greedy), "loglikelihood": float(loglikelihood)}
