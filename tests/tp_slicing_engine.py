"""A stand-in rollout engine for the resharding tests (imported by name: tests/ is on sys.path through its
conftest): it records the tensors it is sent and, like the TP decoder, names the slice each rank holds —
column-parallel tensors split on dim 0 (ceil-division, so uneven rows leave the last rank short), row-parallel
ones on dim 1, the rest replicated. `column(name, shape)` and `row(name, shape)` say which is which."""


class SlicingEngine:
    def __init__(self, tp_rank, tp_size, column, row):
        self.tp_rank, self.tp_size, self.received = tp_rank, tp_size, {}
        self.column, self.row = column, row

    def weight_shard_spec(self, name, shape):
        if self.column(name, shape):
            per = -(-shape[0] // self.tp_size)
            start = min(shape[0], self.tp_rank * per)
            return (0, start, min(shape[0], start + per) - start)
        if self.row(name, shape):
            per = shape[1] // self.tp_size
            return (1, self.tp_rank * per, per)
        return None

    def load_weights(self, weights):
        for name, t in weights:
            self.received[name] = t.clone()

    def expected(self, name, full):
        spec = self.weight_shard_spec(name, tuple(full.shape))
        return full if spec is None else full.narrow(*spec)
