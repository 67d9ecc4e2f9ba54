"""The output buffer pool never hands out memory a live view still uses."""

import gc

import numpy as np

from qstream.core import buffers


def test_views_keep_pooled_memory_alive_and_freed_buffers_are_reused():
    buffers.clear()
    a = buffers.empty((1024, 4096), np.float32)  # 16 MiB: pooled
    a[...] = 1.0
    view = a[::2, 5]
    del a
    gc.collect()
    b = buffers.empty((1024, 4096), np.float32)
    b[...] = 2.0
    assert np.all(view == 1.0)  # the view's memory was not handed out again
    addr = b.__array_interface__["data"][0]
    del b
    gc.collect()
    c = buffers.empty((1024, 4096), np.float32)
    assert c.__array_interface__["data"][0] == addr  # reused
    assert c.flags.writeable and c.flags.c_contiguous


def test_small_arrays_are_plain_numpy():
    x = buffers.empty((10,), np.int8)
    assert x.base is None


def test_scratch_of_an_ended_thread_is_reused_by_the_next_one():
    import threading

    from qstream.core import scratch_pool as sc

    addresses = []

    def work():
        a = sc.scratch("test-spare", (3 << 20,), np.uint8)
        addresses.append(a.ctypes.data)

    def spare_at(address):
        with sc._spare_lock:
            return [b for b in sc._spare if b.ctypes.data == address]

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert len(spare_at(addresses[0])) == 1  # the ended thread's buffer waits in the spares
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert addresses[1] == addresses[0]  # the next thread took it instead of fresh pages
    with sc._spare_lock:  # bounded: never more than SPARE_LIMIT bytes are kept
        assert sum(b.nbytes for b in sc._spare) <= sc.SPARE_LIMIT
