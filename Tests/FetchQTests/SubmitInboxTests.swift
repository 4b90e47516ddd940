@testable import FetchQ
import Glibc
import Synchronization
import Testing

/// A block or async submit with no barrier (with dependencies, when
/// DependencyGate lets it) goes through the engine's inbox (SubmitInbox):
/// it returns without waiting for the engine lock, and
/// whoever holds that lock books it. These check the promises that must
/// survive the deferred booking, from several threads at once: one callback
/// for every accepted submit and none for a refused one, and every call that
/// looks at the scheduler (cancel, wait, stats) seeing every submit that
/// returned before it.
@Suite struct SubmitInboxTests {
    /// What the submitting threads saw.
    final class Tally: @unchecked Sendable {  // guarded by `lock`
        private let lock = ConditionLock()
        private var acceptedIDs: [OpID] = []
        private var refusals: [FetchQError] = []

        func accepted(_ id: OpID) { lock.withLock { acceptedIDs.append(id) } }
        func refused(_ error: FetchQError) { lock.withLock { refusals.append(error) } }
        var ids: [OpID] { lock.withLock { acceptedIDs } }
        var errors: [FetchQError] { lock.withLock { refusals } }
    }

    static let noop: OperationBody = .block { _ in nil }

    /// Polls `done` every 0.1 ms until it holds, for at most 10 s.
    static func within10s(_ done: () -> Bool) {
        let until = monotonicNanos() + 10_000_000_000
        while !done() && monotonicNanos() < until { usleep(100) }
    }

    @Test func submitsFromManyThreadsWhileTheQueueClosesGetOneCallbackEachOrAnError() throws {
        try withEngine(queue: 2) { engine, queue, c in
            let tally = Tally()
            let submitted = Atomic<Int>(0)
            let closed = Atomic<Bool>(false)
            runThreads(5) { index in
                if index == 4 {
                    // Close once the others are well under way (bounded wait).
                    let until = monotonicNanos() + 5_000_000_000
                    while submitted.load(ordering: .relaxed) < 8_000 && monotonicNanos() < until { usleep(100) }
                    queue.close()
                    closed.store(true, ordering: .releasing)
                    return
                }
                // 5 000 submits, then (once the queue closed, at most 10 s
                // later) 200 more, which must all be refused.
                func submit() {
                    do throws(FetchQError) {
                        tally.accepted(try engine.submit(Self.noop, to: queue, options: nil, completion: c.callback))
                    } catch {
                        tally.refused(error)
                    }
                    submitted.add(1, ordering: .relaxed)
                }
                for _ in 0..<5_000 { submit() }
                let until = monotonicNanos() + 10_000_000_000
                while !closed.load(ordering: .acquiring) && monotonicNanos() < until { usleep(100) }
                for _ in 0..<200 { submit() }
            }
            #expect(engine.waitIdle(timeoutMs: 20_000) == .ok)
            let ids = tally.ids
            #expect(Set(ids).count == ids.count)
            #expect(c.count == ids.count)
            #expect(c.duplicates.isEmpty)
            let results = c.waitAll(ids, timeoutMs: 1_000) ?? []
            #expect(results.count == ids.count)
            #expect(results.allSatisfy { $0.outcome == .succeeded || ($0.outcome == .cancelled && $0.status == .cancelled) })
            // Submits after the close are refused (800 at least: 200 per thread).
            let errors = tally.errors
            #expect(errors.count >= 800)
            #expect(errors.allSatisfy { $0.status == .invalid && $0.message == "the queue has been freed" })
            // The engine's counters add up, whenever each submit was booked.
            let stats = engine.stats()
            let succeeded = results.filter { $0.outcome == .succeeded }.count
            #expect(stats.at("/submitted")?.integerValue == Int64(ids.count))
            #expect(stats.at("/succeeded")?.integerValue == Int64(succeeded))
            #expect(stats.at("/cancelled")?.integerValue == Int64(ids.count - succeeded))
            #expect(stats.at("/undelivered")?.integerValue == 0)
        }
    }

    /// The protocol itself, on one thread: an entry pushed while the engine
    /// lock's holder is inside is handed to that holder when it lets the
    /// lock go, or to whoever it hands over to, never dropped; once the
    /// holder found nothing, a submit takes the lock itself.
    @Test func theInboxHandsEveryEntryToTheLocksHolder() throws {
        let inbox = SubmitInbox()
        let engine = try Engine(config: EngineConfig())
        defer { _ = engine.shutdown() }
        func entry(_ id: OpID, queue: QueueID = 1) -> SubmitInbox.Entry {
            .init(op: Operation(id: id, queue: queue, qos: .default, body: Self.noop, callback: .none, engine: engine),
                  priority: .normal, group: nil, startDeadline: nil)
        }
        // Booking would hand each entry's reference to a slot: here it is let go.
        func ids(_ entries: [SubmitInbox.Entry]?) -> [OpID] {
            for entry in entries ?? [] { entry.op.release() }
            return entries?.map(\.id) ?? []
        }
        func released(_ release: SubmitInbox.Release) -> String {
            switch release {
            case .book(let entries): "book \(ids(entries))"
            case .done: "done"
            case .handOver: "handOver"
            }
        }
        func pushed(_ push: SubmitInbox.Push) -> String {
            switch push {
            case .queued: "queued"
            case .mustLock: "mustLock"
            case .refused(let error): "refused \(error.status)"
            }
        }
        #expect(pushed(inbox.push(entry(1))) == "mustLock")  // nobody holds the lock
        #expect(ids(inbox.claim()) == [1])                     // the submitter took it
        #expect(pushed(inbox.push(entry(2))) == "queued")      // held: the holder books it
        #expect(pushed(inbox.push(entry(3))) == "queued")
        #expect(released(inbox.release(stop: false)) == "book [2, 3]")  // in order, before letting go
        #expect(pushed(inbox.push(entry(4))) == "queued")                // still held: more may come
        #expect(released(inbox.release(stop: false)) == "book [4]")
        #expect(released(inbox.release(stop: false)) == "done")         // nothing came: let go
        #expect(pushed(inbox.push(entry(5))) == "mustLock")
        #expect(ids(inbox.claim()) == [5])
        #expect(pushed(inbox.push(entry(6))) == "queued")
        #expect(released(inbox.release(stop: true)) == "handOver")       // its share is booked
        #expect(pushed(inbox.push(entry(9))) == "queued")                // still held: the job books it
        #expect(ids(inbox.claim()) == [6, 9])                            // the job took the lock
        #expect(released(inbox.release(stop: true)) == "done")
        inbox.closeQueue(1)
        #expect(pushed(inbox.push(entry(6, queue: 1))) == "refused invalid")
        #expect(pushed(inbox.push(entry(7, queue: 2))) == "mustLock")
        #expect(ids(inbox.claim()) == [7])
        inbox.refuseAll()
        #expect(pushed(inbox.push(entry(8, queue: 2))) == "refused shutdown")
        #expect(released(inbox.release(stop: false)) == "done")
    }

    @Test func everyAcceptedSubmitRunsWithoutAnyoneWaiting() throws {
        try withEngine(queue: 2) { engine, queue, c in
            // Bursts from 2 threads, each followed only by its callbacks:
            // no wait and no stats, nothing else that takes the engine lock
            // and would book an entry left behind.
            for _ in 0..<50 {
                let tally = Tally()
                runThreads(2) { _ in
                    for _ in 0..<100 {
                        do throws(FetchQError) { tally.accepted(try engine.submit(Self.noop, to: queue, options: nil, completion: c.callback)) }
                        catch { tally.refused(error) }
                    }
                }
                try #require(tally.ids.count == 200)
                try #require(c.waitAll(tally.ids, timeoutMs: 5_000)?.count == 200)
            }
        }
    }

    @Test func anIDJustReturnedCanBeCancelledFromAnotherThread() throws {
        try withEngine(queue: 2) { engine, queue, c in
            queue.setSuspended(true)
            let handOff = Tally()  // ids from the submitting thread, in order
            let cancelled = Atomic<Int>(0)
            let failures = Tally()
            runThreads(2) { index in
                if index == 0 {
                    for _ in 0..<2_000 {
                        do throws(FetchQError) { handOff.accepted(try engine.submit(Self.noop, to: queue, options: nil, completion: c.callback)) }
                        catch { failures.refused(error) }
                    }
                    return
                }
                // Cancel each id as soon as it is handed over (at most 10 s).
                var next = 0
                let until = monotonicNanos() + 10_000_000_000
                while next < 2_000 && monotonicNanos() < until {
                    let ids = handOff.ids
                    while next < ids.count {
                        do throws(FetchQError) {
                            try engine.cancel(ids[next])
                            cancelled.add(1, ordering: .relaxed)
                        } catch {
                            failures.refused(error)
                        }
                        next += 1
                    }
                }
            }
            #expect(failures.errors.isEmpty, "\(failures.errors.prefix(3))")
            #expect(cancelled.load(ordering: .relaxed) == 2_000)
            queue.setSuspended(false)
            #expect(queue.wait(timeoutMs: 20_000) == .ok)
            let results = c.waitAll(handOff.ids, timeoutMs: 1_000) ?? []
            #expect(results.count == 2_000)
            #expect(results.allSatisfy { $0.outcome == .cancelled && $0.status == .cancelled })
        }
    }

    @Test func waitAndStatsSeeEverySubmitThatReturned() throws {
        try withEngine(queue: 2) { engine, queue, c in
            let tally = Tally()
            runThreads(4) { _ in
                for _ in 0..<2_500 {
                    do throws(FetchQError) { tally.accepted(try engine.submit(Self.noop, to: queue, options: nil, completion: c.callback)) }
                    catch { tally.refused(error) }
                }
            }
            #expect(tally.errors.isEmpty)
            // Every submit above returned before this wait began.
            #expect(queue.wait(timeoutMs: 20_000) == .ok)
            #expect(c.count == 10_000)
            let stats = engine.stats()
            #expect(stats.at("/submitted")?.integerValue == 10_000)
            #expect(stats.at("/succeeded")?.integerValue == 10_000)
            #expect(stats.at("/undelivered")?.integerValue == 0)
        }
    }

    /// A callback that submits and returns while another thread holds the
    /// engine lock leaves its submit in the inbox, for that holder to book.
    /// A wait woken by that callback's return (the count of operations
    /// awaiting callbacks fell to 0) must not end before that submit is
    /// booked and has had its own callback. CI once saw the C test
    /// chain_of_submits_from_callbacks end its wait after 1 of 300 links.
    @Test func aWaitCoversASubmitTheLastCallbackLeftInTheInbox() throws {
        try withEngine(queue: 1) { engine, queue, c in
            let entered = Atomic<Bool>(false), release = Atomic<Bool>(false)
            let followID = Atomic<Int64>(0)
            _ = try engine.submit(Self.noop, to: queue, options: nil) { result in
                c.callback(result)
                entered.store(true, ordering: .releasing)
                Self.within10s { release.load(ordering: .acquiring) }
                do throws(FetchQError) {
                    followID.store(try engine.submit(Self.noop, to: queue, options: nil, completion: c.callback),
                                   ordering: .releasing)
                } catch {
                    followID.store(-1, ordering: .releasing)
                }
            }
            Self.within10s { entered.load(ordering: .acquiring) }
            let callbackRuns = entered.load(ordering: .acquiring)
            try #require(callbackRuns)
            let status = Atomic<Int>(-1), callbacksAtReturn = Atomic<Int>(-1)
            let waiter = try startThread(name: "waiter") {
                let rc = engine.waitIdle(timeoutMs: 20_000)
                callbacksAtReturn.store(c.count, ordering: .relaxed)
                status.store(Int(rc.rawValue), ordering: .releasing)
            }
            usleep(50_000)  // the waiter sleeps on the count: 1, the first callback runs
            engine.lockEngine()
            release.store(true, ordering: .releasing)
            Self.within10s { followID.load(ordering: .acquiring) != 0 }
            usleep(50_000)  // the callback returned; the count fell to 0
            let endedWhileHeld = status.load(ordering: .acquiring) != -1
            engine.unlockEngine()
            joinThread(waiter)
            let follow = followID.load(ordering: .acquiring)
            let rc = status.load(ordering: .acquiring), callbacks = callbacksAtReturn.load(ordering: .relaxed)
            #expect(follow > 0)
            #expect(!endedWhileHeld)
            #expect(rc == Int(FQStatus.ok.rawValue))
            #expect(callbacks == 2)
            let stats = engine.stats()
            #expect(stats.at("/submitted")?.integerValue == 2)
            #expect(stats.at("/succeeded")?.integerValue == 2)
        }
    }

    @Test func anEngineFreedWhileThreadsSubmitEndsEveryAcceptedSubmitOnce() throws {
        let engine = try Engine(config: EngineConfig())
        let queue = try engine.makeQueue(name: "q", maxConcurrent: 2)
        let c = Completions()
        let tally = Tally()
        let submitted = Atomic<Int>(0)
        runThreads(4) { index in
            if index == 3 {
                let until = monotonicNanos() + 5_000_000_000
                while submitted.load(ordering: .relaxed) < 3_000 && monotonicNanos() < until { usleep(100) }
                #expect(engine.shutdown() == .ok)
                return
            }
            // Until refused (the engine is being freed), at most 10 s.
            let until = monotonicNanos() + 10_000_000_000
            while monotonicNanos() < until {
                do throws(FetchQError) {
                    tally.accepted(try engine.submit(Self.noop, to: queue, options: nil, completion: c.callback))
                } catch {
                    tally.refused(error)
                    break
                }
                submitted.add(1, ordering: .relaxed)
            }
        }
        let ids = tally.ids
        // fq_engine_free returned: every accepted submit had its callback.
        #expect(c.count == ids.count)
        #expect(c.duplicates.isEmpty)
        #expect(Set(c.completionOrder) == Set(ids))
        #expect(tally.errors.count == 3)
        #expect(tally.errors.allSatisfy { $0.status == .shutdown })
    }
}
