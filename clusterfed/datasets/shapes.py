"""Input shape and class count of each data set, known without loading it.

The server builds the initial model from these, so a server that holds no data (a
deployment) can still start a run.
"""

from clusterfed.datasets.sources import BUILT_IN, is_hugging_face, load_source


class _Shapes(dict):
    """The built-in sets' shapes; an `hf:` set's are read from the set itself on first use."""

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and is_hugging_face(name))

    def __missing__(self, name):
        if not (isinstance(name, str) and is_hugging_face(name)):
            raise KeyError(name)
        source = load_source(name)
        self[name] = (source.input_shape, source.num_classes)
        return self[name]


DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = _Shapes(
    {name: (dataset.input_shape, dataset.num_classes) for name, dataset in BUILT_IN.items()})
