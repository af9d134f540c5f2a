"""The column table's builder (domainbed.results.columns.TableBuilder): each layout's
matrix rows map to the table rows their blocks hold, whether the blocks came in table
order (then each row is its own), out of it, or mixed with another layout's."""
import numpy as np

from domainbed.results.columns import TableBuilder

_A = (("args", "env0_in_acc", "hparams", "step"), "afhi")
_B = (("args", "env0_out_acc", "hparams", "step"), "afhi")


def _block(first, rows):
    values = np.full((rows, 4), np.nan)
    values[:, 1] = np.arange(first, first + rows)     # (each row its own table row)
    values[:, 3] = np.arange(rows)
    return values


def _table(layouts_and_rows):
    builder = TableBuilder()
    first = 0
    for layout, rows in layouts_and_rows:
        builder.add_block(f"run{first}", layout, {"dataset": "D"}, {}, _block(first, rows),
                          None)
        first += rows
    return builder.finish()


def test_each_matrix_row_maps_to_its_table_row():
    for blocks in ([(_A, 3), (_A, 2), (_A, 4)], [(_A, 3), (_B, 2), (_A, 4), (_B, 1)],
                   [(_B, 2), (_A, 0), (_A, 5)]):
        table = _table(blocks)
        store = table.store
        assert store.n_rows == sum(rows for _, rows in blocks)
        for matrix, rows_of in zip(store.matrices, store.rows_of):
            np.testing.assert_array_equal(matrix[:, 1], rows_of)
