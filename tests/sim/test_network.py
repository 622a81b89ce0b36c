"""The network re-rates only the flows at the two NICs a change touches. Against a plain
reference that settles and re-rates every flow at every event, random start/finish
sequences must give the same rates, the same rescheduled flows and the same completion
times (to float rounding: remaining bytes are settled less often)."""

import numpy as np
import pytest

from baton.sim.network import Network

NIC = 1e9


class Reference:
    """Every flow settled and re-rated at every event."""

    def __init__(self):
        self.flows = {}  # id -> [src, dst, bytes_left, rate, updated, version]

    def _settle(self, now):
        for f in self.flows.values():
            f[2] = max(0.0, f[2] - f[3] * (now - f[4]))
            f[4] = now

    def _rebalance(self, now):
        out, inc = {}, {}
        for f in self.flows.values():
            out[f[0]] = out.get(f[0], 0) + 1
            inc[f[1]] = inc.get(f[1], 0) + 1
        changed = {}
        for fid, f in self.flows.items():
            rate = NIC / max(out[f[0]], inc[f[1]])
            if rate != f[3] or f[5] == 0:
                f[3], f[5] = rate, f[5] + 1
                changed[fid] = now + f[2] / rate
        return changed

    def start(self, now, fid, src, dst, nbytes):
        self._settle(now)
        self.flows[fid] = [src, dst, float(nbytes), 0.0, now, 0]
        return self._rebalance(now)

    def finish(self, now, fid):
        self._settle(now)
        self.flows.pop(fid)
        return self._rebalance(now)


@pytest.mark.parametrize("seed", range(20))
def test_local_rerating_matches_the_global_reference(seed):
    rng = np.random.default_rng(seed)
    net, ref = Network(NIC, 0.0), Reference()
    now, live = 0.0, []
    for _ in range(200):
        now += float(rng.exponential(0.01))
        if live and rng.random() < 0.45:
            fid = live.pop(int(rng.integers(len(live))))
            got, want = net.finish(now, fid), ref.finish(now, fid)
        else:
            src, dst = (int(x) for x in rng.integers(0, 6, size=2))
            flow, got = net.start(now, src, dst, float(rng.integers(1, 10**8)), None)
            live.append(flow.flow_id)
            want = ref.start(now, flow.flow_id, src, dst, net.flows[flow.flow_id].bytes_left)
        assert sorted(f.flow_id for _, f in got) == sorted(want)
        for t, f in got:
            assert t == pytest.approx(want[f.flow_id], rel=1e-9, abs=1e-12)
            assert f.rate == ref.flows[f.flow_id][3]
        assert {fid: f.rate for fid, f in net.flows.items()} == {fid: f[3] for fid, f in ref.flows.items()}


def test_bytes_moved_counts_only_what_was_sent():
    net = Network(NIC, 0.0)
    flow, _ = net.start(0.0, 0, 1, 2e9, None)
    net.finish(0.5, flow.flow_id)  # cancelled half-way
    assert net.bytes_moved == pytest.approx(0.5e9)
    assert net.finish(0.6, flow.flow_id) == []  # already gone
