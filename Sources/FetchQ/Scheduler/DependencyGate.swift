import Synchronization

/// Lets a submit with "depends_on" go through the submit inbox (booked
/// later by whoever holds the engine lock, see SubmitInbox) and still keep
/// fetchq.h's promise: a dependency the engine no longer remembers fails
/// the submit itself with FQ_ERR_NOT_FOUND.
///
/// A submit passes when each of its dependencies was handed out and is
/// above `forgottenAbove`, the highest id the scheduler has forgotten
/// (dropped from its history) so far: such an id is still remembered. It
/// counts itself in the current phase until its entry is booked, and the
/// scheduler does not free the slot of an id that a counted submit may
/// have found remembered: it hides it (nobody else finds it any more) and
/// frees it once every submit counted before it was forgotten is booked.
///
/// The two sides, with sequentially consistent atomics (a Dekker pair):
/// the submit counts itself, then reads `forgottenAbove`; the scheduler
/// raises `forgottenAbove`, then reads the counts. Either the scheduler
/// sees the submit counted and keeps the slot, or the submit sees the id
/// forgotten and takes the engine lock instead, where it fails.
///
/// Two phases, so that a steady stream of such submits cannot keep hidden
/// slots forever: the scheduler flips the phase, and what it hid before the
/// flip is freed once the old phase's count is 0 (only submits that began
/// before the flip are counted there).
///
/// Until a submit first asks for the gate (under the engine lock, `open`),
/// nothing is counted and the scheduler forgets without the fence.
final class DependencyGate: Sendable {
    private let forgottenAbove = Atomic<OpID>(0)
    private let phase = Atomic<Int>(0)
    /// Submits counted in phase 0 and 1, not yet booked.
    private let inFlight0 = Atomic<Int>(0)
    private let inFlight1 = Atomic<Int>(0)
    private let opened = Atomic<Bool>(false)

    private func add(_ p: Int, _ n: Int) {
        if p == 0 {
            inFlight0.wrappingAdd(n, ordering: .sequentiallyConsistent)
        } else {
            inFlight1.wrappingAdd(n, ordering: .sequentiallyConsistent)
        }
    }

    // MARK: Submitting threads

    /// Whether a submit may pass the gate at all (see `open`).
    var isOpen: Bool { opened.load(ordering: .acquiring) }

    /// A submit depending on `deps`: the phase it is counted in until it is
    /// booked (`leave`), or nil when it must take the engine lock (the gate
    /// is not open, or a dependency was not handed out, `< handedOut`, or
    /// may have been forgotten).
    func enter(_ deps: [OpID], handedOut: OpID) -> Int? {
        guard isOpen else { return nil }
        let p = phase.load(ordering: .sequentiallyConsistent) & 1
        add(p, 1)
        // A flip in between: the scheduler may already wait for phase p to
        // drain of submits that began before the flip, which this one did not.
        guard phase.load(ordering: .sequentiallyConsistent) & 1 == p else {
            leave(p)
            return nil
        }
        let floor = forgottenAbove.load(ordering: .sequentiallyConsistent)
        for dep in deps where dep <= floor || dep >= handedOut {
            leave(p)
            return nil
        }
        return p
    }

    /// The submit counted in phase `p` was booked (or refused).
    func leave(_ p: Int) {
        add(p, -1)
    }

    // MARK: Under the engine lock

    /// From now on submits may pass (see the type's comment).
    func open() { opened.store(true, ordering: .releasing) }

    /// The scheduler forgets `id`: whether its slot may be freed now (no
    /// counted submit may have found it remembered).
    func forget(_ id: OpID) -> Bool {
        let above = forgottenAbove.load(ordering: .relaxed)  // written under the lock only
        guard opened.load(ordering: .relaxed) else {
            // Nobody counts: the lock's hand-over publishes this to the
            // submit that opens the gate, and to every submit after it.
            if id > above { forgottenAbove.store(id, ordering: .relaxed) }
            return true
        }
        // A lower id needs no store: whoever may have found it remembered
        // read `forgottenAbove` before the store that raised it past `id`,
        // and so counted itself before this thread's loads below.
        if id > above { forgottenAbove.store(id, ordering: .sequentiallyConsistent) }
        return drained(0) && drained(1)
    }

    /// Starts a new phase; returns the old one, whose submits all began
    /// before every forgetting so far.
    func flip() -> Int {
        let old = phase.load(ordering: .relaxed)
        phase.store(old &+ 1, ordering: .sequentiallyConsistent)
        return old & 1
    }

    /// No submit of phase `p` is waiting to be booked.
    func drained(_ p: Int) -> Bool {
        (p == 0 ? inFlight0.load(ordering: .sequentiallyConsistent) : inFlight1.load(ordering: .sequentiallyConsistent)) == 0
    }
}
