"""The engine's timing and bound constants, in one place (tests may shrink them)."""

from __future__ import annotations

# Publishes that may wait for the IO thread. A publisher that gets further ahead waits for
# it: this gives the IO thread the GIL, and keeps the queued publishes (memory, and the
# garbage collector's work over them) bounded. Small enough that the IO thread gets the GIL
# every few milliseconds of publishing, to send and settle as well as store; large enough
# that the hand-offs between the threads and the loop's work per iteration are shared by
# many publishes: with members' credit as a window (lane.py) that keeps frames on their
# way, 2,000 cut a producer's CPU per message by a sixth against 500.
MAX_AHEAD_MSGS = 2000
# Payload bytes of the same (a publish larger than this waits until none is queued): large
# payloads queue a few MiB at a time, not 2,000 of them. Plain publish() calls join one
# stretch until the IO thread takes it, and it stages a stretch in one transaction, so this
# also bounds a loop iteration's commit. Longer commits keep members' acks, and so their
# next frames, waiting: at 16 MiB, 16 KiB payloads were sent slower than they were
# published, the outbox grew into new pages of the file (slower to write) and sends read
# records back (11k msgs/s, against 50-60k at 4 MiB).
MAX_AHEAD_BYTES = 4 << 20
MAX_PUBS_PER_LOOP = 10_000  # publishes staged in one loop iteration (one LMDB transaction)

# -- membership (membership.py: SWIM with Lifeguard's suspicion) ------------------------------
# One probe per heartbeat_interval_s (the protocol period). A probe unanswered this share of
# the period is asked of INDIRECT_PROBES other members; unanswered at the period's end, its
# target is suspected.
PROBE_TIMEOUT_SHARE = 0.5
INDIRECT_PROBES = 3
# A suspicion becomes a death after dead_after_s; one that began with a closed connection
# (a process that ends closes them all) sooner as other members confirm it on their own:
# down to SUSPICION_MIN_PERIODS periods with SUSPICION_CONFIRMATIONS of them (Lifeguard).
# A live node refutes it as soon as it hears of it (it rides on every frame to it).
SUSPICION_MIN_PERIODS = 1.5
SUSPICION_CONFIRMATIONS = 3
# News (joins, suspicions, refutations, deaths) goes to GOSSIP_FANOUT random members every
# GOSSIP_SHARE of a period while there is some, and rides on probes; each piece is sent
# RETRANSMIT_MULT * log10(members + 1) times (rounded up).
GOSSIP_SHARE = 0.2
GOSSIP_FANOUT = 3
RETRANSMIT_MULT = 4
RUMORS_PER_FRAME = 12
# A dead member is probed now and then (one every DEAD_PROBE_PERIODS periods, in turn), so a
# member cut off for a while and back is told it was declared dead, refutes, and is alive
# again with the sockets it had.
DEAD_PROBE_PERIODS = 4
FORGET_DEAD_AFTER_S = 600.0  # a dead member is forgotten (its sockets closed) after this
# A loop that did not run for this many periods was starved: what it did not hear in the
# meantime (refutations too) does not count against the members it suspects.
STARVED_PERIODS = 1.5
# Anti-entropy: every this many heartbeats a node names all its live peers in a hello to
# one of them, which meets any it did not know (gossip may miss one, rarely).
SYNC_BEATS = 30
# What one node keeps of the mesh, so that no sender can make it open sockets (and file
# descriptors) without bound: peers in all (a node refuses more), peers that have not
# said hello yet (known from membership frames and rumors only: not remembered in the
# store, forgotten once dead), and contacts that are not seeds (endpoints still to meet).
MAX_PEERS = 256
MAX_UNMET_PEERS = 32
MAX_CONTACTS = 64
REFUSAL_LOG_INTERVAL_S = 60.0
# What an ephemeral subscription holds queued at most, besides its max_in_flight messages
# (at the mean size of the batch that arrives): a subscriber that does not keep up
# misses the rest (at most once), where its queue would grow without bound.
EPHEMERAL_QUEUE_BYTES = 16 << 20
# The keys a latest_wins lane's index holds before those whose message the lane no longer
# owes are dropped (then again once it has doubled): a topic whose keys come and go (one
# per device, per session) would otherwise keep every key it ever saw.
LATEST_KEYS_PRUNE = 1024
# The (topic, lane) pairs whose subscriptions a consumer keeps found (a cache, emptied
# when full): a pattern subscription meets topics that come and go.
RECEIVERS_KEPT = 4096
# How often a consumer saves when a producer that keeps sending was last heard from
# (inbox/heard.py): a restart counts a producer silent since its last save.
HEARD_SAVE_S = 60.0
# A topic's lane of a group subscribed by pattern that owed nothing and was owed nothing
# new for this long is forgotten: the topic's next publish makes it again (a topic per
# device, published a while and then never again, would otherwise keep its lane for good).
QUIET_LANE_FORGET_S = 600.0

# -- the wall clock (outbox/wallclock.py) ------------------------------------------------------
# A heartbeat that finds the wall clock moved this much more (or less) than the monotonic
# clock since the last one sees a step (NTP slews a clock by 0.5 ms a second at most).
CLOCK_STEP_TOLERANCE_S = 1.0
CLOCK_STEPS_KEPT = 256  # steps remembered for retention (the oldest forgotten first)
# How often the clock's state is saved without a step: after a reboot, the time since the
# last save is not counted as observed time (groups' idle time, retention).
CLOCK_SAVE_S = 60.0
