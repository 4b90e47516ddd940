/// Identical in-flight GETs share one transfer, and every caller gets its own
/// result from the one response.
///
/// The first caller runs the transfer itself, as an ordinary operation of its
/// queue (it "leads": `Operation.leads`); later callers attach to it and hold
/// no slot. The transfer runs at the highest priority among its callers (the
/// leading caller can lower its own, not the transfer below the others'). A
/// caller that cancels is detached. When the leading caller is cancelled while
/// others still wait, an engine-internal carrier operation takes the transfer
/// over: a running transfer goes on uninterrupted (the carrier inherits the
/// leader's slot), a queued one is queued again for the callers left. A
/// carrier's transfer is cancelled only when no caller is left.
///
/// `@unchecked Sendable`: every field is guarded by the engine's lock.
final class SharedTransfer: @unchecked Sendable {
    let key: CoalesceKey
    /// The operation running the transfer: the leading caller, or a carrier.
    var carrier: OpID = 0
    /// `carrier` is the leading caller (not an internal carrier).
    var ownerLed = true
    /// The callers attached to the transfer (not the leading caller).
    var callers: [Operation] = []
    var priority: Priority
    /// The highest priority an attached caller asked for (at submit or with
    /// `fq_set_priority`): the leading caller cannot lower the transfer below it.
    var callersPriority: Priority? = nil
    /// The callers' "max_wait_ms" (part of the key: the same for all of them).
    let maxWaitMs: Int
    /// The transfer ended: no more callers may attach.
    var done = false
    /// When the operation running the transfer waits to retry it: the
    /// monotonic time of the next attempt, and the attempts made. A carrier
    /// queued for the callers (the leading caller was cancelled meanwhile)
    /// waits as long and goes on counting.
    var retryAt: UInt64? = nil
    var attempts = 0
    /// And what the HTTP cache gave the attempts (`Operation.nextAttemptCache`):
    /// the carrier's retry sends the same validators and stores its answer
    /// (it had none: the tenth review's check of the session's changes).
    var nextAttemptCache: Engine.CacheContext? = nil

    init(key: CoalesceKey, priority: Priority, maxWaitMs: Int) {
        self.key = key
        self.priority = priority
        self.maxWaitMs = maxWaitMs
    }

    /// With the engine's lock held: an attached caller asked for `priority`
    /// (at submit or with `fq_set_priority`). It is remembered as a floor for
    /// the leading caller, and lifts the transfer if it is higher.
    func lift(to priority: Priority, in machine: inout Engine.Machine,
              now: UInt64) -> [Engine.Machine.Action] {
        if callersPriority.map({ priority.rawValue > $0.rawValue }) ?? true { callersPriority = priority }
        guard priority.rawValue > self.priority.rawValue else { return [] }
        self.priority = priority
        if case .success(let actions) = machine.setPriority(carrier, priority, now: now) { return actions }
        return []
    }
}
