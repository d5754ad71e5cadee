"""Our plain-torch view of the CPU_ATTN paged cache agrees with the kernel that writes it (vec ISA), and
slot moves carry keys and values together."""

import torch

from eagle3_plugin.vllm import paged_kv


def write_with_kernel(kv_cache, keys, values, slots):
    from vllm import _custom_ops as ops
    blocks, heads, block_size, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(blocks, heads, 2 * block_size, -1).chunk(2, dim=2)  # as the backend does
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slots, "vec", k_scale=1.0, v_scale=1.0,
                                   kv_cache_dtype="auto")


def test_gather_reads_what_the_kernel_wrote():
    torch.manual_seed(0)
    blocks, heads, block_size, d = 4, 2, 32, 64  # block_size != head_size: a transposed read would fail
    kv_cache = torch.zeros(blocks, heads, block_size, 2 * d)
    slots = torch.tensor([0, 1, 31, 32, 70, 127])
    keys, values = torch.randn(len(slots), heads, d), torch.randn(len(slots), heads, d)
    write_with_kernel(kv_cache, keys, values, slots)
    got_keys, got_values = paged_kv.gather(kv_cache, slots)
    assert torch.equal(got_keys, keys) and torch.equal(got_values, values)


def test_move_slots_moves_keys_and_values():
    torch.manual_seed(1)
    kv_cache = torch.zeros(2, 2, 32, 64)
    slots = torch.arange(10)
    keys, values = torch.randn(10, 2, 32), torch.randn(10, 2, 32)
    write_with_kernel(kv_cache, keys, values, slots)
    # a path's nodes 3, 7 to depths 1, 2
    paged_kv.move_slots([paged_kv.key_value_caches(kv_cache)], torch.tensor([3, 7]), torch.tensor([1, 2]))
    got_keys, got_values = paged_kv.gather(kv_cache, torch.tensor([0, 1, 2]))
    assert torch.equal(got_keys, keys[[0, 3, 7]]) and torch.equal(got_values, values[[0, 3, 7]])


def test_block_table_slots():
    row = torch.tensor([5, 2, 9])
    assert paged_kv.block_slots(row[None], 66, 32)[0, [0, 31, 32, 65]].tolist() == [160, 191, 64, 289]
