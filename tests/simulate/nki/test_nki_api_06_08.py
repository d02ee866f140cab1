"""The APIs NKI 0.6-0.8 added to the current namespace, against the semantics their reference
pages document (cited in asickernels/simulate/nki/reference.json): tile grids, scalars,
topk, the PRNG state instructions, Tensor Indirection, the 2-D gather-transpose index form,
instruction handles and the GpSimd activation engine. Each test computes the documented
result independently with numpy."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from current_api import run, stored

from asickernels.simulate import nki
from asickernels.simulate.nki import errors, runtime
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl


# -- tile grids (nki.language.tiles, blocks, alloc_tiles, alloc_blocks, NkiGrid) ---------
def test_tiles_cover_a_tensor_tile_by_tile_with_clamped_boundary_tiles(rng):
    x = rng.normal(size=(300, 520)).astype(np.float32)

    def kernel(src):
        grid = nl.tiles(src, tile_shape=(128, 256))
        assert grid.shape == (3, 3) and grid.tile_shape == (128, 256)
        assert grid.index_step_elements == (128, 256)
        corner = grid[2, 2]
        assert corner.shape == () and corner.element_shape == (44, 8) and corner.is_remainder
        assert not grid[0, 0].is_remainder and grid.is_remainder
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        out_grid = nl.tiles(out, tile_shape=(128, 256))
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                tile = nl.ndarray(grid[i, j].element_shape, dtype=src.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=tile.data, src=grid[i, j].data)  # NkiTensor.data is itself
                nisa.tensor_scalar(tile, tile, nl.add, float(10 * i + j))
                nisa.dma_copy(dst=out_grid[i, j].data, src=tile)
        return out

    rows, cols = np.arange(300) // 128, np.arange(520) // 256
    added = (10 * rows[:, None] + cols[None, :]).astype(np.float32)
    np.testing.assert_array_equal(run(kernel, x), x + added)


def test_untiled_leading_hbm_dimensions_are_walked_one_slab_at_a_time(rng):
    x = rng.normal(size=(3, 256, 64)).astype(np.float32)

    def kernel(src):
        grid = nl.tiles(src, tile_shape=(128, 64))
        assert grid.shape == (3, 2, 1) and grid.index_step_elements == (1, 128, 64)
        assert grid[1, 0, 0].element_shape == (128, 64)  # the consumed slab index drops out
        assert grid[0:2, 1, 0].element_shape == (2, 128, 64)
        tile = nl.ndarray((128, 64), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=grid[2, 1, 0].data)
        return stored(tile)

    np.testing.assert_array_equal(run(kernel, x), x[2, 128:])


def test_a_selection_is_one_tensor_view_only_when_its_cells_are_evenly_spaced(rng):
    x = rng.normal(size=(256, 512)).astype(np.float32)

    def kernel(src):
        grid = nl.tiles(src, tile_shape=(128, 128))
        row, column, gapped = grid[1], grid[:, 2], grid[0, ::2]
        assert row.shape == (4,) and row.element_shape == (128, 512)
        assert column.element_shape == (256, 128) and column.is_data_representable
        assert gapped.shape == (2,) and not gapped.is_data_representable
        with pytest.raises(errors.ShapeMismatch, match="is_data_representable"):
            gapped.data  # noqa: B018 (the property raises)
        tile = nl.ndarray((128, 512), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=row.data)
        return stored(tile)

    np.testing.assert_array_equal(run(kernel, x), x[128:])


def test_alloc_tiles_lays_on_chip_tiles_side_by_side_along_the_free_axis(rng):
    x = rng.normal(size=(256, 300)).astype(np.float32)

    def kernel(src):
        buf = nl.alloc_tiles(
            tile_shape=(128, 128), element_shape=(256, 300), buffer=nl.sbuf, dtype=nl.float32
        )
        assert buf.shape == (2, 3) and buf.element_shape == (256, 300)
        assert buf.buffer is nl.sbuf and buf.dtype == nl.float32
        # one storage of 6 tiles x 128 elements per partition, counted once
        assert runtime.active_run("test").sbuf_in_use == 6 * 128 * 4
        assert buf[1].is_data_representable and not buf[:, 0].is_data_representable
        src_tiles = nl.tiles(src, tile_shape=(128, 128))
        for i in range(2):
            nisa.dma_copy(dst=buf[i].data, src=src_tiles[i].data)  # a whole tile row per DMA
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        out_tiles = nl.tiles(out, tile_shape=(128, 128))
        for i in range(2):
            for j in range(3):
                nisa.dma_copy(dst=out_tiles[i, j].data, src=buf[i, j].data)
        return out

    np.testing.assert_array_equal(run(kernel, x), x)


def test_a_psum_grid_gives_each_tile_whole_banks_and_runs_on_trn2(rng):
    """Before NeuronCore-v4 a matmul writes a PSUM tile within one 2 KiB bank: a PSUM grid
    of one-bank tiles is four tiles of one bank each, not one four-bank tensor; smaller
    tiles share a bank."""
    lhs_t = rng.normal(size=(128, 128)).astype(np.float32)
    rhs = rng.normal(size=(128, 2048)).astype(np.float32)

    def kernel(lhs_t, rhs):
        acc = nl.alloc_tiles(
            tile_shape=(128, 512), element_shape=(128, 2048), buffer=nl.psum, dtype=nl.float32
        )
        assert runtime.active_run("test").psum_banks_in_use == 4
        small = nl.alloc_tiles(
            tile_shape=(128, 128), element_shape=(128, 1024), buffer=nl.psum, dtype=nl.float32
        )  # 8 tiles of 512 bytes: two banks
        assert runtime.active_run("test").psum_banks_in_use == 6
        del small
        a = nl.load(lhs_t)
        b = nl.load(rhs)
        out = nl.ndarray(rhs.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        for j in range(4):
            nisa.nc_matmul(dst=acc[0, j].data, stationary=a, moving=b[:, j * 512 : (j + 1) * 512])
            tile = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=tile, src=acc[0, j].data)
            nisa.dma_copy(dst=out[:, j * 512 : (j + 1) * 512], src=tile)
        return out

    with runtime.targeting("trn2"):
        np.testing.assert_allclose(run(kernel, lhs_t, rhs), lhs_t.T @ rhs, rtol=1e-4, atol=1e-4)

        def too_big():  # a 2-bank tile, which only NeuronCore-v4 writes
            nl.alloc_tiles(
                tile_shape=(128, 1024), element_shape=(128, 2048), buffer=nl.psum, dtype=nl.float32
            )

        with pytest.raises(errors.SizeOfDimensionExceedArchLimit, match="4096 bytes"):
            run(too_big)


def test_blocks_group_tiles_and_tiles_of_a_block_expose_its_interior(rng):
    x = rng.normal(size=(384, 640)).astype(np.float32)

    def kernel(src):
        blocks = nl.blocks(src, tile_shape=(128, 128), block_shape=(2, 2))
        assert blocks.shape == (2, 3) and blocks.block_shape == (2, 2)
        assert blocks.index_step_elements == (256, 256)
        assert blocks[1, 2].element_shape == (128, 128) and blocks[1, 2].is_remainder
        inner = nl.tiles(blocks[0, 1])
        assert isinstance(inner, nl.NkiTileGrid) and inner.shape == (2, 2)
        assert isinstance(blocks, nl.NkiGrid) and isinstance(blocks, nl.NkiBlockGrid)
        sbuf = nl.alloc_blocks(
            tile_shape=(128, 128),
            block_shape=(2, 2),
            element_shape=(384, 640),
            buffer=nl.sbuf,
            dtype=nl.float32,
        )
        assert sbuf.shape == (2, 3)
        tile = nl.ndarray((128, 128), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=inner[1, 0].data)
        return stored(tile)

    np.testing.assert_array_equal(run(kernel, x), x[128:256, 256:384])


def test_an_sbuf_tensor_over_128_partitions_is_reached_by_dma_or_tile_by_tile(rng):
    """The nki.language.NkiBlockGrid page's example allocates each block's element_shape,
    (256, 512), in SBUF: the memory holds it as two 128-partition tiles (counted twice per
    partition); DMAs move it whole, compute instructions take one tile at a time."""
    x = rng.normal(size=(512, 1024)).astype(np.float32)

    @nki.jit
    def copy_block_grid(src):
        tile_shape = (128, 256)
        block_shape = (2, 2)
        src_blocks = nl.blocks(src, tile_shape=tile_shape, block_shape=block_shape)
        dst = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        dst_blocks = nl.blocks(dst, tile_shape=tile_shape, block_shape=block_shape)
        for i in range(src_blocks.shape[0]):
            for j in range(src_blocks.shape[1]):
                src_block = src_blocks[i, j]
                block = nl.blocks(
                    nl.ndarray(src_block.element_shape, dtype=src.dtype, buffer=nl.sbuf),
                    tile_shape=src_block.tile_shape,
                    block_shape=src_block.block_shape,
                )
                if i == j == 0:  # two partition tiles of 512 fp32
                    assert runtime.active_run("test").sbuf_in_use == 2 * 512 * 4
                nisa.dma_copy(dst=block.data, src=src_block.data)
                tiles = nl.tiles(block.data, tile_shape=(128, 512))
                for t in range(2):  # one 128-partition tile per instruction
                    nisa.activation(dst=tiles[t].data, op=nl.exp, data=tiles[t].data)
                nisa.dma_copy(dst=dst_blocks[i, j].data, src=block.data)
        return dst

    np.testing.assert_allclose(copy_block_grid(x), np.exp(x), rtol=1e-5)

    def whole(src):
        wide = nl.ndarray((256, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=wide, value=0.0)

    with pytest.raises(errors.NumPartitionExceedArchLimit, match="partition dimension 256"):
        run(whole, x)


def test_empty_like_packs_a_gapped_selection_densely_and_transposes_tiles(rng):
    x = rng.normal(size=(128, 640)).astype(np.float32)

    def kernel(src):
        grid = nl.tiles(src, tile_shape=(128, 128))
        packed = nl.empty_like(grid[0, ::2], buffer=nl.sbuf)  # tiles 0, 2, 4
        assert isinstance(packed, nl.NkiTileGrid) and packed.shape == (3,)
        assert packed.element_shape == (128, 384) and packed.is_data_representable
        for k, j in enumerate((0, 2, 4)):
            nisa.dma_copy(dst=packed[k].data, src=grid[0, j].data)
        flipped = nl.empty_like(grid[0, 1], buffer=nl.sbuf, transpose_axes=(1, 0))
        assert flipped.element_shape == (128, 128)
        tensor_like = nl.empty_like(nl.ndarray((4, 8), nl.float32), transpose_axes=(1, 0))
        assert tensor_like.shape == (8, 4)
        return stored(packed.data)

    np.testing.assert_array_equal(
        run(kernel, x), np.concatenate([x[:, 0:128], x[:, 256:384], x[:, 512:]], axis=1)
    )


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"tile_shape": [128, 128]}, TypeError),  # a list, not a tuple
        ({"tile_shape": (128,)}, ValueError),  # fewer than two dimensions
        ({"tile_shape": (128, 0)}, ValueError),
        ({"tile_shape": (np.int64(128), 128)}, TypeError),  # not exact Python ints
        ({"tile_shape": (1, 128, 128, 128)}, ValueError),  # more dimensions than the extent
        ({"buffer": "sbuf"}, TypeError),
    ],
)
def test_alloc_tiles_refuses_what_its_reference_page_refuses(arguments, error):
    def kernel():
        options = {
            "tile_shape": (128, 128),
            "element_shape": (128, 256),
            "buffer": nl.sbuf,
            "dtype": nl.float32,
        }
        nl.alloc_tiles(**{**options, **arguments})

    with pytest.raises(error):
        run(kernel)


def test_grid_indices_out_of_range_raise():
    def kernel():
        grid = nl.alloc_tiles(
            tile_shape=(128, 128), element_shape=(128, 256), buffer=nl.sbuf, dtype=nl.float32
        )
        grid[0, 2]

    with pytest.raises(errors.TensorAccessOutOfBound):
        run(kernel)


# -- scalars (nki.isa.NkiScalar, scalar_load, scalar_store, scalar_alu) ------------------
def test_scalar_arithmetic_wraps_at_its_width_and_divides_toward_zero():
    values = np.array([[100000], [-17], [4], [2**31 - 1]], np.int32)

    def kernel(src):
        tile = nl.ndarray((4, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=src)
        big, minus17, four, largest = (nisa.scalar_load(tile[i : i + 1]) for i in range(4))
        results = [
            big * big,  # 10**10 wraps to 1410065408 (nki.isa.NkiScalar)
            largest + 1,  # the largest int32 plus one is the smallest
            nisa.scalar_alu(minus17, four, op=nl.divide),  # -4
            nisa.scalar_alu(minus17, four, op=nl.fmod),  # -1
            minus17 // four,
            -minus17,
            (minus17 < four) + (four == 4),  # comparisons: int32 1 or 0
            nisa.scalar_alu(minus17, 3, op=nl.maximum),
        ]
        out = nl.ndarray((len(results), 1), dtype=nl.int32, buffer=nl.sbuf)
        for k, value in enumerate(results):
            nisa.scalar_store(out[k : k + 1], value)
        return stored(out)

    got = run(kernel, values).reshape(-1)
    np.testing.assert_array_equal(got, [1410065408, -(2**31), -4, -1, -4, 17, 2, 3])


def test_python_ints_fold_at_trace_time():
    def kernel():
        assert nisa.scalar_alu(-17, 4, op=nl.divide) == -4
        assert nisa.scalar_alu(3, 5, op=nl.less) is True

    run(kernel)


def test_int64_scalars_keep_their_range_but_only_add_subtract_and_multiply():
    def kernel(src):
        tile = nl.ndarray((1, 1), dtype=nl.int64, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=src)
        value = nisa.scalar_load(tile)
        assert value.dtype == nl.int64
        doubled = value * 2
        with pytest.raises(errors.UnsupportedOperator):
            value // 2
        with pytest.raises(errors.UnsupportedDtype):  # widths never mix
            value + nisa.scalar_load(nl.zeros((1, 1), nl.int32))
        with pytest.raises(errors.UnsupportedDtype):  # an int64 tile takes an int64 scalar
            nisa.scalar_store(nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf), doubled)
        with pytest.raises(errors.UnsupportedDtype):  # no 64-bit loop bound
            nl.fori_loop(0, value, lambda i: None)
        with pytest.raises(errors.UnsupportedDtype):  # on-chip offsets are 32-bit
            nl.ndarray((1, 4), nl.float32).ap([[4, 1], [1, 1]], scalar_offset=value, indirect_dim=1)
        out = nl.ndarray((1, 1), dtype=nl.int64, buffer=nl.sbuf)
        nisa.scalar_store(out, doubled)
        return stored(out)

    big = np.array([[3 * 2**40]], np.int64)
    np.testing.assert_array_equal(run(kernel, big), 2 * big)


def test_scalar_loads_and_stores_refuse_what_the_reference_refuses():
    def kernel():
        with pytest.raises(errors.UnsupportedDtype):  # unsigned: use the signed type
            nisa.scalar_load(nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf))
        with pytest.raises(errors.ShapeMismatch):
            nisa.scalar_load(nl.zeros((2, 1), nl.int32))
        with pytest.raises(TypeError):  # a Python int stores nothing on device
            nisa.scalar_store(nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf), 3)

    run(kernel)


def test_fori_loop_hands_its_body_a_scalar_usable_as_an_offset(rng):
    data = rng.normal(size=(1, 8)).astype(np.float32)
    bound = np.array([[5]], np.int32)

    def kernel(src, count):
        count_tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=count_tile, src=count)
        out = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.zeros((1, 8), nl.float32))
        seen = []

        def body(i):
            assert isinstance(i, nisa.NkiScalar)
            seen.append(i.value)
            element = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(element, src.ap([[8, 1], [1, 1]], scalar_offset=i + 1, indirect_dim=1))
            nisa.dma_copy(out.ap([[8, 1], [1, 1]], scalar_offset=i, indirect_dim=1), element)

        nl.fori_loop(1, nisa.scalar_load(count_tile), body)
        assert seen == [1, 2, 3, 4]
        return out

    expected = np.zeros((1, 8), np.float32)
    expected[0, 1:5] = data[0, 2:6]
    np.testing.assert_array_equal(run(kernel, data, bound), expected)


def test_while_loop_runs_while_its_condition_is_nonzero():
    def kernel():
        count = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(count, 3)
        steps = []

        def body(state):
            steps.append(state.value)
            return state - 1

        nl.while_loop(nisa.scalar_load(count), body)
        assert steps == [3, 2, 1]

    run(kernel)


def test_fori_loop_unroll_takes_compile_time_bounds_only():
    def kernel():
        seen = []
        nl.fori_loop(2, 8, lambda i: seen.append(i.value), step=3, unroll=True)
        assert seen == [2, 5]
        count = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(count, 3)
        with pytest.raises(TypeError, match="compile time"):  # a device value: no unrolling
            nl.fori_loop(0, nisa.scalar_load(count), lambda i: None, unroll=True)
        with pytest.raises(TypeError, match="unroll"):
            nl.fori_loop(0, 2, lambda i: None, unroll="yes")

    run(kernel)


@pytest.mark.parametrize("flag", [-2, 0, 5])
def test_if_else_runs_the_branch_a_device_condition_selects(rng, flag):
    """The nki.language.if_else reference page's example: +10 when the flag is > 0, else
    -10; any nonzero scalar selects then_fn."""
    data = rng.normal(size=(4, 8)).astype(np.float32)

    def kernel(flag_input, src):
        flag_tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=flag_tile, src=flag_input)
        result = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=result, src=src)
        taken = []
        nl.if_else(
            nisa.scalar_load(flag_tile) > 0,
            lambda: nisa.tensor_scalar(result, result, op0=nl.add, operand0=10.0),
            lambda: nisa.tensor_scalar(result, result, op0=nl.subtract, operand0=10.0),
        )
        nl.if_else(nisa.scalar_load(flag_tile), lambda: taken.append("nonzero"))
        assert taken == ([] if flag == 0 else ["nonzero"])
        return stored(result)

    out = run(kernel, np.array([[flag]], np.int32), data)
    np.testing.assert_array_equal(out, data + np.float32(10.0 if flag > 0 else -10.0))


def test_if_else_resolves_python_conditions_and_refuses_other_ones():
    def kernel():
        taken = []
        nl.if_else(True, lambda: taken.append("then"), lambda: taken.append("else"))
        nl.if_else(0, lambda: taken.append("then"), lambda: taken.append("else"))
        nl.if_else(False, lambda: taken.append("then"))  # no else_fn: nothing runs
        assert taken == ["then", "else"]
        wide = nl.ndarray((1, 1), dtype=nl.int64, buffer=nl.sbuf)
        nisa.memset(wide, 1)
        with pytest.raises(errors.UnsupportedDtype):  # the condition is 32-bit
            nl.if_else(nisa.scalar_load(wide), lambda: None)
        with pytest.raises(TypeError):  # a tensor is not a scalar
            nl.if_else(nl.zeros((1, 1), nl.int32), lambda: None)
        with pytest.raises(TypeError):
            nl.if_else(True, "not a function")

    run(kernel)


# -- nki.isa.topk --------------------------------------------------------------------------
@pytest.mark.parametrize("k", [8, 16, 21])
@pytest.mark.parametrize("sort", [False, True])
def test_topk_writes_each_16_partition_snakes_top_k_back_as_a_snake(rng, k, sort):
    """The 0.7 reference's layout: result j of a group at partition j % 16, column j // 16;
    only the first ceil(k / 16) columns are written (the rest keep their values)."""
    n = 42
    values = rng.permutation(32 * 3).astype(ml_dtypes.bfloat16).reshape(32, 3)
    written = -(-k // 16)

    def kernel(src):
        tile = nl.ndarray((32, 3), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=src)
        top = nl.ndarray((32, k), dtype=nl.bfloat16, buffer=nl.sbuf)
        index = nl.ndarray((32, k), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.memset(top, -7.0)
        nisa.memset(index, 7)
        nisa.topk(val_dst=top, idx_dst=index, src=tile, n=n, sorted=sort)
        return stored(top), stored(index)

    top, index = run(kernel, values)
    for group in range(2):
        rows = slice(16 * group, 16 * (group + 1))
        snake = values[rows].T.reshape(-1)[:n].astype(np.float32)
        expected = np.argsort(-snake, kind="stable")[:k]  # largest first (no ties here)
        got_index = index[rows, :written].T.reshape(-1)  # back from the snake layout
        got_top = top[rows, :written].astype(np.float32).T.reshape(-1)
        np.testing.assert_array_equal(got_index[:k], expected)
        np.testing.assert_array_equal(got_top[:k], snake[expected])
        assert np.isnan(got_top[k:]).all() and (got_index[k:] == 0xFFFFFFFF).all()
        assert (top[rows, written:].astype(np.float32) == -7.0).all()  # not written
        assert (index[rows, written:] == 7).all()


def test_topk_sorted_is_a_bool():
    def kernel():
        src = nl.ndarray((16, 2), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(src, 0.0)
        top = nl.ndarray((16, 4), dtype=nl.bfloat16, buffer=nl.sbuf)
        index = nl.ndarray((16, 4), dtype=nl.uint32, buffer=nl.sbuf)
        with pytest.raises(TypeError, match="sorted"):
            nisa.topk(top, index, src, 20, sorted="yes")

    run(kernel)


@pytest.mark.parametrize(
    ("n", "k", "partitions", "error"),
    [
        (7, 4, 16, errors.SizeOfDimensionExceedArchLimit),  # 8 <= n
        (20, 21, 16, errors.SizeOfDimensionExceedArchLimit),  # K <= n
        (40, 4, 16, errors.ShapeMismatch),  # src needs ceil(n / 16) = 3 columns
        (20, 4, 24, errors.ShapeMismatch),  # partitions a multiple of 16
    ],
)
def test_topk_constraints(n, k, partitions, error):
    def kernel():
        src = nl.ndarray((partitions, 2), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(src, 0.0)
        top = nl.ndarray((partitions, k), dtype=nl.bfloat16, buffer=nl.sbuf)
        index = nl.ndarray((partitions, k), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.topk(top, index, src, n)

    with pytest.raises(error):
        run(kernel)


# -- PRNG state (nki.isa.set_rng_seed, rand_set_state, rand_get_state) --------------------
def test_a_saved_prng_state_replays_the_same_numbers():
    def kernel():
        saved = nl.ndarray((128, 6), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(saved)
        first = nl.ndarray((128, 64), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rng(first, engine=nisa.engine.gpsimd)
        nisa.rand_set_state(saved)
        again = nl.ndarray((128, 64), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rng(again, engine=nisa.engine.gpsimd)
        return stored(first), stored(again)

    first, again = run(kernel)
    np.testing.assert_array_equal(first, again)
    assert len(np.unique(first)) > 0.99 * first.size  # 32 random bits each


def test_set_rng_seed_makes_the_vector_engine_sequence_repeatable():
    def draw(seed):
        def kernel():
            seeds = nl.ndarray((1, 1), dtype=nl.uint32, buffer=nl.sbuf)
            nisa.memset(seeds, seed)
            nisa.set_rng_seed(seeds)
            values = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
            nisa.rand2(values, 0.0, 1.0)
            return stored(values)

        return run(kernel)

    np.testing.assert_array_equal(draw(7), draw(7))
    assert not np.array_equal(draw(7), draw(8))
    assert draw(7).min() >= 0.0 and draw(7).max() <= 1.0


def test_prng_state_rules_follow_the_generation():
    def kernel(engine, words):
        state = nl.ndarray((128, words), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(state, engine=engine)

    run(lambda: kernel(nisa.engine.vector, 24))  # NeuronCore-v4: the Vector engine too
    with pytest.raises(errors.ShapeMismatch):  # GpSimd keeps 6 words per lane
        run(lambda: kernel(nisa.engine.gpsimd, 24))
    with runtime.targeting("trn2"), pytest.raises(errors.UnsupportedEngine):
        run(lambda: kernel(nisa.engine.vector, 24))
    with runtime.targeting("trn1"), pytest.raises(errors.UnsupportedOperator):
        run(lambda: kernel(nisa.engine.gpsimd, 6))


# -- Tensor Indirection (NkiTensor.indirect) and the 2-D gather-transpose ----------------
def test_indirect_views_gather_and_scatter_columns(rng):
    data = rng.normal(size=(32, 40)).astype(np.float32)
    offsets = rng.permutation(40)[:20].astype(np.int32)
    index = np.zeros((32, 2), np.int32)
    for i, offset in enumerate(offsets):  # offset i sits at index[i % 16, i // 16]
        index[i % 16, i // 16] = offset

    def kernel(src, idx):
        tile = nl.load(src)
        index_tile = nl.load(idx)
        picked = nl.ndarray((32, 20), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(picked, tile.indirect(index_tile, num_elem=20))
        nisa.tensor_scalar(tile.indirect(index_tile, num_elem=20), picked, nl.multiply, -1.0)
        return stored(picked), stored(tile)

    picked, scattered = run(kernel, data, index)
    np.testing.assert_array_equal(picked, data[:, offsets])
    expected = data.copy()
    expected[:, offsets] *= -1
    np.testing.assert_array_equal(scattered, expected)


def test_indirect_needs_neuroncore_v4():
    def kernel():
        tile = nl.zeros((16, 8), nl.float32)
        tile.indirect(nl.zeros((16, 1), nl.int32))

    with runtime.targeting("trn2"), pytest.raises(errors.UnsupportedOperator):
        run(kernel)


@pytest.mark.parametrize("columns", [1, 2])
def test_gather_transpose_takes_a_2d_index_column_by_column(rng, columns):
    """nki.isa.dma_transpose, "Indirect transpose": flat = indices.T.flatten(); the rows
    src[flat] are gathered and transposed."""
    rows = 128 * columns
    src = rng.normal(size=(300, 128)).astype(ml_dtypes.bfloat16)
    indices = rng.integers(0, 300, size=(128, columns)).astype(np.uint32)

    def kernel(table, idx):
        idx_tile = nl.load(idx)
        dst = nl.ndarray((128, rows), dtype=table.dtype, buffer=nl.sbuf)
        gathered = table.ap([[128, rows], [1, 128]], vector_offset=idx_tile, indirect_dim=0)
        nisa.dma_transpose(dst=dst, src=gathered, axes=(1, 0))
        return stored(dst)

    np.testing.assert_array_equal(run(kernel, src, indices), src[indices.T.reshape(-1)].T)


# -- instruction handles (nki.isa.NkiInstruction) -----------------------------------------
def test_instructions_return_handles_that_order_by_depends_on():
    def kernel():
        a = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        first = nisa.memset(a, 1.0)
        second = nisa.tensor_scalar(a, a, nl.add, 1.0)
        assert isinstance(first, nisa.NkiInstruction)
        assert second.depends_on(first) is second
        with pytest.raises(TypeError):
            second.depends_on(a)
        inside = []
        nl.fori_loop(0, 1, lambda i: inside.append(nisa.memset(a, 0.0)))
        second.depends_on(first).depends_on(first)  # chained: the same edge twice
        with pytest.raises(errors.NkiValidationError, match="dynamic loop"):
            second.depends_on(inside[0])  # out of a loop body
        nl.fori_loop(0, 1, lambda i: nisa.memset(a, 0.0).depends_on(first))  # enclosing scope
        for kind in (nisa.dependency.runtime, nisa.dependency.schedule):  # NKI 0.7's kinds
            assert second.depends_on(first, kind=kind) is second
        with pytest.raises(TypeError, match="kind"):
            second.depends_on(first, kind="runtime")

    run(kernel)


@pytest.mark.parametrize("reduce_op", [nl.add, nl.maximum])
def test_scalar_tensor_tensor_reduces_its_result_into_reduce_res(rng, reduce_op):
    """NKI 0.7's reduce_op/reduce_res/reduce_cmd: the result's free-axis reduction per
    partition, accumulated as tensor_scalar_reduce accumulates."""
    data = rng.normal(size=(64, 24)).astype(np.float32)
    other = rng.normal(size=(64, 24)).astype(np.float32)

    def kernel(d, o):
        a, b = (nl.ndarray((64, 24), dtype=nl.float32, buffer=nl.sbuf) for _ in range(2))
        nisa.dma_copy(dst=a, src=d)
        nisa.dma_copy(dst=b, src=o)
        out = nl.ndarray((64, 24), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
        again = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(
            out, a, nl.multiply, 2.0, nl.add, b, reduce_op=reduce_op, reduce_res=total
        )
        nisa.scalar_tensor_tensor(  # keeps accumulating
            out, a, nl.multiply, 2.0, nl.add, b, reduce_cmd=nisa.reduce_cmd.reduce,
            reduce_op=reduce_op, reduce_res=again,
        )  # fmt: skip
        with pytest.raises(TypeError, match="reduce_op"):
            nisa.scalar_tensor_tensor(out, a, nl.multiply, 2.0, nl.add, b, reduce_res=total)
        return stored(out), stored(total), stored(again)

    out, total, again = run(kernel, data, other)
    expected = data * np.float32(2.0) + other
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    reduce = np.add if reduce_op is nl.add else np.maximum
    once = reduce.reduce(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(total, once, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again, reduce(once, once), rtol=1e-5, atol=1e-5)


def test_execute_needs_a_device():
    with pytest.raises(NotImplementedError, match=r"nki\.execute"):
        nki.execute(lambda x: x, np.zeros((1, 1), np.float32))


# -- activation engines (nki.isa.activation / activate2, NKI 0.7) -------------------------
def test_activations_run_on_gpsimd_without_their_accumulator(rng):
    x = rng.normal(size=(128, 16)).astype(np.float32)

    def kernel(src):
        tile = nl.load(src)
        out = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(out, nl.exp, tile, engine=nisa.engine.gpsimd)
        with pytest.raises(errors.UnsupportedEngine):
            nisa.activation(
                out,
                nl.exp,
                tile,
                reduce_op=nl.add,
                reduce_res=nl.ndarray((128, 1), nl.float32),
                reduce_cmd=nisa.reduce_cmd.reset_reduce,
                engine=nisa.engine.gpsimd,
            )
        doubled = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(
            doubled, nl.exp, tile, 2.0, 0.0, nl.multiply, nl.bypass, engine=nisa.engine.gpsimd
        )
        return stored(out), stored(doubled)

    out, doubled = run(kernel, x)
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(doubled, np.exp(2 * x), rtol=1e-6)
    assert nki.last_counters()["gpsimd_instructions"] == 2

    with runtime.targeting("trn2"), pytest.raises(errors.UnsupportedEngine):
        run(
            lambda: nisa.activation(
                nl.zeros((4, 4), nl.float32),
                nl.exp,
                nl.zeros((4, 4), nl.float32),
                engine=nisa.engine.gpsimd,
            )
        )


# -- out-of-bounds rows of indirect DMAs (oob_mode) ---------------------------------------
def test_indirect_rows_out_of_bounds_raise_unless_the_dma_skips_them(rng):
    """nki.isa.dma_copy, oob_mode: an out-of-range offset raises by default; with
    ``oob_mode.skip`` the DMA leaves that row alone (nki-library's attention_block_tkg
    scatters with uint32-max offsets for batches to skip)."""
    cache = rng.normal(size=(6, 4)).astype(np.float32)
    offsets = np.array([[4], [0xFFFFFFFF], [1]], np.uint32)
    update = rng.normal(size=(3, 4)).astype(np.float32)

    def kernel(table, idx, new, mode):
        index = nl.load(idx)
        rows = nl.load(new)
        nisa.dma_copy(
            dst=table.ap([[4, 3], [1, 4]], vector_offset=index, indirect_dim=0),
            src=rows,
            oob_mode=mode,
        )
        picked = nl.ndarray((3, 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(picked, -1.0)
        gathered = table.ap([[4, 3], [1, 4]], vector_offset=index, indirect_dim=0)
        nisa.dma_copy(dst=picked, src=gathered, oob_mode=mode)
        return stored(picked)

    expected_cache = cache.copy()
    expected_cache[[4, 1]] = update[[0, 2]]
    picked = run(kernel, cache, offsets, update, nisa.oob_mode.skip)
    np.testing.assert_array_equal(cache, expected_cache)
    np.testing.assert_array_equal(picked, [update[0], [-1.0] * 4, update[2]])
    with pytest.raises(errors.TensorAccessOutOfBound, match=r"rows \[1\]"):
        run(kernel, cache, offsets, update, nisa.oob_mode.error)


def test_a_skipped_gather_transpose_leaves_its_columns_alone(rng):
    src = rng.normal(size=(20, 16)).astype(ml_dtypes.bfloat16)
    indices = np.array([[3], [25], [7], [19]] * 4, np.uint32)  # 25 is outside the 20 rows

    def kernel(table, idx):
        dst = nl.ndarray((16, 16), dtype=table.dtype, buffer=nl.sbuf)
        nisa.memset(dst, 0.0)
        gathered = table.ap([[16, 16], [1, 16]], vector_offset=nl.load(idx), indirect_dim=0)
        nisa.dma_transpose(dst=dst, src=gathered, axes=(1, 0), oob_mode=nisa.oob_mode.skip)
        return stored(dst)

    out = run(kernel, src, indices)
    flat = indices.reshape(-1)
    for column, row in enumerate(flat):
        expected = src[row] if row < 20 else np.zeros(16, src.dtype)
        np.testing.assert_array_equal(out[:, column], expected)


def test_dma_copy_keeps_the_nki_0_2_read_modify_write(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)

    def kernel(src):
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.load(src))
        nisa.dma_copy(dst=out, src=nl.load(src), dst_rmw_op=nl.add)
        return out

    with pytest.warns(errors.DeprecatedApiWarning, match="dst_rmw_op was removed in NKI 0.3"):
        np.testing.assert_array_equal(run(kernel, x), 2 * x)


# -- a tensor in a Python condition ------------------------------------------------------------
def test_a_tensor_in_a_condition_is_a_presence_test():
    """The compiler resolves ``if`` before any tensor holds a value (the language guide's
    "Control Flow"): a tensor is True whatever it holds, as nki-library's kernels test optional
    tensors (``if expert_index:``, indices that may be 0)."""

    def kernel(x, bias=None):
        zeros = nl.full((128, 4), 0.0, dtype=nl.float32)
        assert zeros and nl.equal(zeros, nl.full((128, 4), 3.0, dtype=nl.float32))
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        if bias:
            tile = nl.add(tile, nl.load(bias))
        nl.store(out, tile)
        return out

    x = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(run(kernel, x), x)
    np.testing.assert_array_equal(run(kernel, x, x + 1), x + 1)


def test_elementwise_functions_broadcast_free_axes_and_abs_max_keeps_the_sign():
    def kernel():
        a = nl.full((128, 4), -5.0, dtype=nl.float32)
        b = nl.full((128, 1), 3.0, dtype=nl.float32)
        return stored(nl.abs_max(a, b)), stored(nl.abs_min(a, b)), stored(nl.add(a, b))

    bigger, smaller, total = run(kernel)
    np.testing.assert_array_equal(bigger, np.full((128, 4), -5.0))  # |-5| > |3|: -5
    np.testing.assert_array_equal(smaller, np.full((128, 4), 3.0))
    np.testing.assert_array_equal(total, np.full((128, 4), -2.0))


# -- nki.compiler.CompileConfig --------------------------------------------------------------
def test_compile_config_is_checked_as_the_sdk_checks_it_and_changes_no_result(rng):
    """The CompileConfig options reference's introductory kernel (NKI allocation with
    prefetch_auto), written against this package: same result as without a config."""
    from asickernels.simulate.nki.compiler import (  # nki.compiler
        AddressRotation,
        Allocation,
        AllocationMode,
        CompileConfig,
        OptLevel,
        SchedulingHeuristic,
        SpecializationConfig,
    )

    @nki.jit(compile_config=CompileConfig(allocation=Allocation.LINEAR, prefetch_auto=True))
    def add_one_kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        result = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=result, data=tile, op0=nl.add, operand0=1.0)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=result)
        return out

    x = rng.standard_normal((128, 64)).astype(np.float32)
    np.testing.assert_array_equal(add_one_kernel(x), x + 1)
    np.testing.assert_array_equal(add_one_kernel[2](x), x + 1)

    config = CompileConfig(
        allocation=Allocation.LINEAR,
        scheduling=True,
        opt_level=OptLevel.O2,
        experimental_allocation_mode=AllocationMode.RING,
        experimental_scheduling_heuristic=SchedulingHeuristic.CRITICAL_PATH,
        address_rotation=AddressRotation.DISABLE,
    )
    assert config.nki_alloc_fallback and not config.dma_copy_elim  # "On by default"; off
    assert (
        CompileConfig().allocation is Allocation.COLORING
        and CompileConfig().opt_level is OptLevel.O1
    )
    # the troubleshooting page's "Configuration errors"
    with pytest.raises(
        ValueError, match=re.escape("scheduling=True needs allocation=Allocation.LINEAR")
    ):
        CompileConfig(scheduling=True)
    with pytest.raises(
        TypeError, match=re.escape("must be an nki.compiler.AllocationMode or None")
    ):
        CompileConfig(experimental_allocation_mode="FAST")
    with pytest.raises(
        TypeError, match=re.escape("address_rotation must be an nki.compiler.AddressRotation")
    ):
        CompileConfig(address_rotation="auto")
    with pytest.raises(TypeError, match="no option"):
        CompileConfig(prefetch=True)
    with pytest.raises(TypeError, match="compile_config"):
        nki.jit(compile_config={"allocation": "linear"})(lambda: None)

    # a kernel called from a kernel runs under the top-level kernel's config
    @nki.jit(compile_config=CompileConfig(opt_level=OptLevel.O0))
    def inner(x):
        return nl.load(x)

    def outer(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, inner(x))
        return out

    with pytest.raises(errors.NkiValidationError, match="'inner' is called from inside another"):
        nki.jit(outer)(x)
    override = SpecializationConfig(allow_nested_config_override=True)
    with pytest.warns(UserWarning, match="inlined under the top-level config"):
        np.testing.assert_array_equal(nki.jit(specialization_config=override)(outer)(x), x)
    np.testing.assert_array_equal(
        nki.jit(compile_config=CompileConfig(opt_level=OptLevel.O0))(outer)(x), x
    )
