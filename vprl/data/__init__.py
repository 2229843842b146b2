"""The data layer: `Example` records, dataset loaders, split recipes and the shapes world.

It imports nothing else of vprl.
"""

from vprl.data.records import Example, read_examples, read_jsonl, write_jsonl

__all__ = ["Example", "read_examples", "read_jsonl", "write_jsonl"]
