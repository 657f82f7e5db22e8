"""The vocabulary every strategy is written in, and its Flower face: what a round asks and
gets back (``exchange``: asks, replies, client info, the weighted mean), the errors and the
result a run ends with (``contract``), typed parameters (``params``), the within-cluster
aggregators (``aggregation``) and Flower's ``Strategy`` methods that hand a strategy to the
round driver (``flower_hooks``). No algorithm lives here: each is its own module in
``clusterfed.strategies``."""
