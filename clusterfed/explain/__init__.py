"""What a run says about its decisions, outside the strategies' cores: functions that read a
strategy's ``State`` and ``Params`` and return sentences (why a run ended with one cluster,
what to try, the evidence for its cluster count). One module per family."""
