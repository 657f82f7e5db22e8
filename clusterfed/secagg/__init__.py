"""Secure aggregation (SecAgg+) inside groups of clients: the protocol pieces.

The server learns the weighted sum of a group's replies, never one member's: SecAgg+ (Bell et
al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020), the protocol
of Flower's ``SecAggPlusWorkflow``, run as one instance per group (a cluster), several side by
side. Two pieces, wired into a round by a driver:

- ``secagg_mod`` (client): ``ClientApp(mods=[secagg_mod])`` on a stock Message-API ClientApp;
  nothing else in the user's code changes (``clusterfed.secagg.client``).
- ``GroupProtocol(members, settings)`` (server): a Message-free state machine per group; its
  ``asks()`` say what to send each member at each stage, ``take(replies)`` reads the stage's
  replies, ``result()`` is the unmasked, dequantized weighted sum and mean
  (``clusterfed.secagg.group``; ``run_groups`` runs several groups, ``split_groups`` applies the
  small-group rule, ``wire`` converts asks and replies to and from Flower records).

In a round: a strategy with ``secure_aggregation`` yields a ``SecureTrain`` (core/exchange.py)
from its training step (``ClusteredStrategy.secure_train``: its trainers grouped by cluster,
``split_groups`` first); the driver runs it (``clusterfed.runner.secure``: one exchange of train
messages per stage over its Link, the collect stage carrying each member's model and train
config) and hands back ``SecureSums`` (each cluster's unmasked mean), which
``ClusteredStrategy.aggregate_sums`` makes the cluster models, with DP noise under ``dp_*``.
Which strategies take it, and why the others refuse it: docs/privacy.md, "Secure aggregation in
the round".

Decisions, and why:

**A mod of our own, not Flower's ``secaggplus_mod``.** In Flower 1.41 (tested here; the test
runs on whichever Flower is installed) the mod reads the train reply through the legacy
conversion ``recorddict_to_fitres``, which looks for the records ``fitres.parameters`` /
``fitres.num_examples``: a Message-API train function's reply
``{"arrays": ArrayRecord, "metrics": MetricRecord}`` raises ``KeyError: 'fitres.parameters'``
there, after training (tests/test_secagg_settings.py shows it). Its server side exists only as
the legacy ``SecAggPlusWorkflow`` around a legacy ``Strategy``. So the mod here is built on
Flower's primitives from ``flwr.common.secure_aggregation`` and ``flwr.supercore.primitives``:
key pairs and ECDH key agreement (``generate_key_pairs``, ``generate_shared_key``), Shamir
shares (``create_shares``/``combine_shares``), authenticated encryption of the shares (Fernet:
``encrypt``/``decrypt``) and the share framing (``share_keys_plaintext_concat``/``_separate``),
with Flower's stage names, order and checks. Two parts differ from Flower's, each for a reason:

- masks are expanded from the full 32-byte seeds with AES-256-CTR (the ``cryptography`` package
  Flower itself depends on, after HKDF-SHA256), not with Flower's ``pseudo_rand_gen``, which
  folds a seed to 32 bits and draws from NumPy's Mersenne Twister: 2**32 possible masks per seed
  is a space one can search, and MT19937 is not a cryptographic generator;
- quantization (``vectors.quantize``) rounds stochastically with the mod's own generator,
  seeded by the session and the member (so the same inputs give the same sum), not Flower's
  ``quantize``, which draws from NumPy's global generator (it would change the user's own
  random stream between rounds) and does not count what it clips.

**Weighting.** A member's vector is ``[w, c, w*q]`` with ``w`` its integer weight (the reply
metric ``weight_key``, default ``num-examples``; None = 1 per member), ``c`` how many values it
clipped, ``q`` all arrays of the reply (every ArrayRecord, in the reply's order) quantized. The
server gets ``W = sum w``, the total clipped and ``sum w*q``, hence the weighted sum and mean.
The weight travels only masked (the mod removes it from the clear metrics; other metrics, such
as the training loss, stay in the clear, as in Flower's SecAgg+). Weights are exact integers,
not quantized (Flower quantizes ``w / max_weight``); the modulus must hold
``members * max_weight * quantization_range`` (checked per group).

**Clipping and the quantization error.** Every value is clipped to ``[-R, R]`` (``clipping_range``,
default 8) and quantized to ``T + 1`` levels (``quantization_range`` T, default 2**24) by unbiased
stochastic rounding. For values inside ``[-R, R]`` each value of the group's weighted mean is
off by less than ``2R/T`` (about 9.5e-7 with the defaults), and the weighted sum by less than
``W * 2R/T``. The rule: choose R at least the largest absolute value a client returns (for full
model weights, the largest weight; for updates, the largest update); values outside are
clipped, and only the group's total count of clipped values reaches the server
(``GroupResult.clipped``). Non-finite values fail the member's reply (it drops out of the
round), since the server can no longer check them.

**Small groups.** A group below ``settings.minimum_group_size()`` (``min_group_size``, default
and lowest allowed 3, or an integer ``threshold`` if larger) is not securely aggregated:
``GroupProtocol`` refuses it (``GroupTooSmall``) before any ask, and ``split_groups`` holds it
back: its members are not asked for updates that round and its model is kept. It is never summed
in the clear. Three is the least with a threshold of at least 2 (a secret is never in one
member's hands) and a sum of more than two (in a sum of two, each member could subtract its own
update from the released model and read the other's). A round in which fewer than
``max(threshold, min_group_size)`` members complete ends with ``SecAggError``, and no sum.

**One session at a time per client.** A client's protocol state is one record in its
``Context.state``; a new setup starts over. Groups are disjoint (a client is in one cluster per
round), so several groups run side by side with one exchange per stage for all.

**Dropouts.** Members may drop at any stage: those gone before sending their masked vector are
left out of the sum (their pairwise masks rebuilt from their neighbours' shares of their mask
key), those gone after it stay in (their own mask's seed rebuilt from shares). Up to
``shares - threshold`` members of a neighbourhood may drop (``group_plan``).
"""

from clusterfed.secagg.client import ProtocolViolation, secagg_client_mod, secagg_mod
from clusterfed.secagg.group import GroupProtocol, GroupResult, run_groups, split_groups
from clusterfed.secagg.settings import (
    GroupPlan,
    GroupTooSmall,
    SecAggError,
    SecAggSettings,
    SecAggSettingsError,
    group_plan,
)

__all__ = ["GroupPlan", "GroupProtocol", "GroupResult", "GroupTooSmall", "ProtocolViolation", "SecAggError",
           "SecAggSettings", "SecAggSettingsError", "group_plan", "run_groups", "secagg_client_mod", "secagg_mod",
           "split_groups"]
