"""Per-block values cut from a blob on access (domainbed.results.block_values): the same
items, in the same order, as the plain lists they stand for, through a ColumnTable too."""
import json

import numpy as np
import pytest

from domainbed.results.block_values import BlockValues, Texts, ValuesBuilder, take
from domainbed.results.columns import TableBuilder

TEXTS = [b'{"a": 1}', b"", b'{"b": [2, 3]}', b"null"]


def _texts(prefix=b"HEADER"):
    ends = np.cumsum([len(t) for t in TEXTS])
    return Texts.from_ends(prefix + b"".join(TEXTS) + b"TRAILER", ends, len(prefix))


def test_texts_are_the_slices_of_their_blob():
    texts = _texts()
    assert list(texts) == TEXTS and len(texts) == 4
    assert texts[-1] == b"null" and type(texts[0]) is bytes
    assert list(texts.take(np.array([2, 0, 2]))) == [TEXTS[2], TEXTS[0], TEXTS[2]]
    assert list(texts[1:3]) == TEXTS[1:3]
    with pytest.raises(IndexError):
        texts[4]


def test_block_values_string_pieces_together_and_take_replacements():
    values = BlockValues([["x"], _texts(), [], ["y", "z"]])
    expected = ["x", *TEXTS, "y", "z"]
    assert list(values) == expected and len(values) == 7 and values[-1] == "z"
    values[2] = {"a": 1}
    assert values[2] == {"a": 1} and values[3] == TEXTS[2]
    with pytest.raises(IndexError):
        values[7]
    picked = take(values, np.array([6, 2, 0]))
    assert list(picked) == ["z", {"a": 1}, "x"]
    lazy = take(BlockValues([_texts()]), np.array([3, 2]))
    assert isinstance(lazy, BlockValues) and list(lazy) == [TEXTS[3], TEXTS[2]]


def test_a_builder_without_texts_gives_a_plain_list():
    builder = ValuesBuilder()
    builder.append(1)
    builder.extend([2, 3])
    assert builder.finish() == [1, 2, 3]
    builder.extend(_texts())
    builder.append(4)
    found = builder.finish()
    assert isinstance(found, BlockValues) and list(found) == [1, 2, 3, *TEXTS, 4]


def test_a_table_of_blocks_given_as_texts_decodes_them_on_use():
    layout = (("args", "hparams", "step"), "ahi")
    args = [{"dataset": "D", "test_envs": [i]} for i in range(3)]
    hparams = [{"lr": i / 10} for i in range(3)]
    matrix = np.array([[np.nan, np.nan, float(s)] for s in range(6)])

    def texts(objects):
        encoded = [json.dumps(o).encode() for o in objects]
        return Texts.from_ends(b"".join(encoded), np.cumsum([len(e) for e in encoded]))

    builder = TableBuilder(decode=json.loads)
    builder.add_block("first", layout, args[0], hparams[0], matrix[:1], None)
    builder.add_blocks([layout], [matrix[1:]], np.array([0, 0]), np.array([0, 2]),
                       np.array([2, 3]), ["second", "third"], texts(args[1:]),
                       texts(hparams[1:]), np.zeros((2, 0), dtype=np.int64), {})
    table = builder.finish()
    expected = [{"args": args[b], "hparams": hparams[b], "step": s, "run_dir": d}
                for b, s, d in [(0, 0, "first"), (1, 1, "second"), (1, 2, "second"),
                                (2, 3, "third"), (2, 4, "third"), (2, 5, "third")]]
    assert table.subset([2, 0]).records == [expected[3], expected[4], expected[5],
                                            expected[0]]
    assert table.records == expected


def test_a_values_list_in_one_pass_equals_the_values_one_by_one():
    import numpy as np

    from domainbed.results.block_values import BlockValues, Texts, as_list
    texts = Texts.from_ends(b"xxabcdef", np.array([1, 3, 6]), at=2)
    values = BlockValues([["first"], texts, [{"a": 1}]])
    values[2] = {"decoded": True}
    assert as_list(values) == [values[i] for i in range(len(values))] == \
        ["first", b"a", {"decoded": True}, b"def", {"a": 1}]
    plain = [1, 2]
    assert as_list(plain) is plain
