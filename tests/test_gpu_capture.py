"""A graph capture refuses a synchronizing call loudly (graphs.capture_chain), and the device
captures and replays normally afterwards. Runs with `pytest -m gpu`; skipped without CUDA."""
import pytest
import torch

from dynspec.errors import DynspecError
from dynspec.runtime.engines.reference.graphs import capture_chain

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("sync", ["item", "blocking-copy", "tolist"])
def test_a_sync_inside_a_capture_is_refused_then_capture_works(sync):
    x = torch.arange(4, dtype=torch.float32, device="cuda")
    out = torch.zeros(4, device="cuda")
    pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()

    def bad(cut) -> None:
        y = x * 2
        cut(0)                                          # the second graph of the chain syncs
        if sync == "item":
            y.sum().item()
        elif sync == "blocking-copy":
            y.add_(torch.ones(4).to("cuda"))
        else:
            y.tolist()

    with pytest.raises(DynspecError, match=r"CUDA graph capture failed \(graph 2 of its chain\): .*(synchroniz|during CUDA graph capture)"):
        capture_chain(bad, frozenset({0}), pool, stream)
    assert torch.cuda.get_sync_debug_mode() == 0          # restored

    def good(cut) -> None:
        y = x * 3
        cut(0)
        out.copy_(y + 1)

    chain = capture_chain(good, frozenset({0}), torch.cuda.graph_pool_handle(), stream)
    assert len(chain.graphs) == 2
    x.fill_(1.0)
    chain.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [4.0] * 4
