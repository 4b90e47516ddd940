@testable import FetchQ
import Glibc
import Testing

/// The engine holds some references to operation objects by hand (a
/// scheduler slot, a submit waiting in the inbox, a job waiting for a
/// worker). Each must be given back exactly once, whichever way the
/// operation goes: run by a worker (queued as a job, or picked up by the
/// worker that ended the one before), cancelled while queued, or cancelled
/// when its queue closed.
@Suite struct OperationLifetimeTests {
    /// Captured by an operation's body, which the operation object holds:
    /// alive exactly as long as that object.
    final class Sentinel: Sendable {}

    /// Weak references to the sentinels, one per submitted operation.
    final class Watch: @unchecked Sendable {  // guarded by `lock`
        private final class Weak {
            weak var object: Sentinel?
            init(_ object: Sentinel) { self.object = object }
        }
        private let lock = ConditionLock()
        private var refs: [Weak] = []

        /// A body holding a new sentinel that this watch follows.
        func body() -> OperationBody {
            let sentinel = Sentinel()
            lock.withLock { refs.append(Weak(sentinel)) }
            return .block { _ in withExtendedLifetime(sentinel) { nil } }
        }

        var alive: Int { lock.withLock { refs.filter { $0.object != nil }.count } }
        var count: Int { lock.withLock { refs.count } }
    }

    @Test func everyOperationObjectIsLetGoHoweverItEnds() throws {
        let watch = Watch()
        try withEngine(#"{"workers": 2}"#, queue: 2) { engine, queue, c in
            // Run: more than the queue's limit, so ends pick up the next one
            // and starts also wait in the pool.
            var ids: [OpID] = []
            for _ in 0..<3_000 { ids.append(try engine.submit(watch.body(), to: queue, options: nil, completion: c.callback)) }
            // Cancelled while queued in a suspended queue, booked first.
            let held = try engine.makeQueue(name: "held", maxConcurrent: 2)
            held.setSuspended(true)
            for _ in 0..<500 { ids.append(try engine.submit(watch.body(), to: held, options: nil, completion: c.callback)) }
            #expect(held.cancelAll() == 500)
            // Cancelled when their queue closed (booked, then ended).
            let closing = try engine.makeQueue(name: "closing", maxConcurrent: 1)
            closing.setSuspended(true)
            for _ in 0..<500 { ids.append(try engine.submit(watch.body(), to: closing, options: nil, completion: c.callback)) }
            closing.close()
            #expect(engine.waitIdle(timeoutMs: 20_000) == .ok)
            let results = c.waitAll(ids, timeoutMs: 5_000) ?? []
            #expect(results.count == 4_000)
            #expect(results.filter { $0.outcome == .succeeded }.count == 3_000)
            #expect(results.filter { $0.outcome == .cancelled }.count == 1_000)
            // A worker lets its operation go right after the end it books:
            // allow it a moment (bounded), then every object must be gone.
            let until = monotonicNanos() + 5_000_000_000
            while watch.alive > 0 && monotonicNanos() < until { usleep(1_000) }
            #expect(watch.count == 4_000)
            #expect(watch.alive == 0)
        }
    }

    /// Making and freeing queues does not grow the engine: a freed queue's
    /// id goes to a new one once its callbacks returned and nobody holds its
    /// Queue object (one still held keeps its id).
    @Test func freedQueuesIdsAreGivenToNewQueues() throws {
        try withEngine { engine, _, c in
            var ids = Set<QueueID>()
            for _ in 0..<50 {
                let q = try engine.makeQueue(name: "cycle", maxConcurrent: 1)
                ids.insert(q.id)
                let id = try engine.submit(.block { _ in nil }, to: q, options: nil, completion: c.callback)
                #expect(c.wait(id)?.outcome == .succeeded)
                #expect(q.wait(timeoutMs: 5000) == .ok)
                q.close()
            }
            // One or two (the loop's variable may still hold the last queue).
            #expect(ids.count <= 2, "\(ids.sorted())")
            let held = try engine.makeQueue(name: "held", maxConcurrent: 1)
            held.close()
            let next = try withExtendedLifetime(held) { try engine.makeQueue(name: "next", maxConcurrent: 1) }
            #expect(next.id != held.id)
            let id = try engine.submit(.block { _ in nil }, to: next, options: nil, completion: c.callback)
            #expect(c.wait(id)?.outcome == .succeeded)
        }
    }
}
