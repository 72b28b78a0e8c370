"""The executor and what serves requests through it: the plan of a step and its result (plan.py),
the executor (plan, advance, fold), the loop strategies, K decisions (planning.py), the request
pool and table, the plan channel between ranks, the driver, the executor thread and the gc heap.
"""
