@testable import FetchQ
import CJansson
import Testing

/// The engine's FIFO (worker jobs, delivery items, ready entries, history)
/// against an Array as the reference.
@Suite struct RingTests {
    /// Counts live instances, to see when the ring lets an element go.
    final class Tracked {
        let value: Int
        let live: Counter
        init(_ value: Int, _ live: Counter) {
            self.value = value
            self.live = live
            live.n += 1
        }
        deinit { live.n -= 1 }
    }

    final class Counter { var n = 0 }

    @Test func randomAppendsAndRemovalsKeepOrderAcrossWrapAndGrowth() {
        var ring = Ring<Int>()
        var reference: [Int] = []
        var g = SplitMix(seed: 7)
        var next = 0
        for _ in 0..<50_000 {
            switch g.below(10) {
            case 0..<5:
                ring.append(next)
                reference.append(next)
                next += 1
            case 5..<9:
                if !reference.isEmpty { #expect(ring.removeFirst() == reference.removeFirst()) }
            default:
                // Into an empty array (the buffer's elements move), an
                // emptied one that kept its capacity, or after what an
                // array holds.
                var taken: [Int] = g.below(2) == 0 ? [] : [-1, -2]
                if g.below(3) == 0 {
                    taken.reserveCapacity(64)
                    taken.removeAll(keepingCapacity: true)
                }
                let before = taken
                ring.takeAll(into: &taken)
                #expect(taken == before + reference)
                reference.removeAll()
            }
            #expect(ring.count == reference.count)
            #expect(ring.isEmpty == reference.isEmpty)
            #expect(ring.first == reference.first)
        }
        #expect(next > 20_000)
    }

    @Test func aRingThatWrapsBeforeGrowingKeepsOrder() {
        // Head in the middle of the buffer when it fills: both segments move.
        var ring = Ring<Int>()
        for i in 0..<8 { ring.append(i) }
        for i in 0..<5 { #expect(ring.removeFirst() == i) }
        for i in 8..<20 { ring.append(i) }
        #expect(ring.capacity == 16)
        var all: [Int] = []
        ring.takeAll(into: &all)
        #expect(all == Array(5..<20))
        #expect(ring.isEmpty && ring.first == nil)
    }

    @Test func copiesAreIndependent() {
        var a = Ring<Int>()
        for i in 0..<10 { a.append(i) }
        var b = a
        b.append(10)
        #expect(a.removeFirst() == 0)
        var restA: [Int] = []
        a.takeAll(into: &restA)
        var restB: [Int] = []
        b.takeAll(into: &restB)
        #expect(restA == Array(1..<10))
        #expect(restB == Array(0...10))
    }

    @Test func elementsAreReleasedWhenTakenAndWhenTheRingGoes() {
        let live = Counter()
        do {
            var ring = Ring<Tracked>()
            for i in 0..<100 { ring.append(Tracked(i, live)) }
            #expect(live.n == 100)
            // A removed element is not kept alive by the buffer.
            weak let gone = ring.first
            _ = ring.removeFirst()
            #expect(gone == nil)
            #expect(live.n == 99)
            var moved: [Tracked] = []
            for _ in 0..<20 { _ = ring.removeFirst() }
            ring.takeAll(into: &moved)
            #expect(moved.map(\.value) == Array(21..<100))
            #expect(live.n == 79)
            moved = []
            #expect(live.n == 0)
            for i in 0..<30 { ring.append(Tracked(i, live)) }
            #expect(live.n == 30)
        }
        #expect(live.n == 0)  // the ring's own elements went with it
    }

    @Test func aLargeBufferIsGivenBackWhenTheRingEmpties() {
        var ring = Ring<Int>()
        for i in 0..<100 { ring.append(i) }
        for _ in 0..<100 { ring.removeFirst() }
        #expect(ring.capacity == 128)  // small: kept for the next use
        for i in 0..<(Ring<Int>.keptCapacity * 2 + 1) { ring.append(i) }
        #expect(ring.capacity > Ring<Int>.keptCapacity)
        for _ in 0..<(Ring<Int>.keptCapacity * 2) { ring.removeFirst() }
        #expect(ring.count == 1)
        ring.removeFirst()
        #expect(ring.capacity == 0)
        for i in 0..<(Ring<Int>.keptCapacity * 2) { ring.append(i) }
        var all: [Int] = []
        ring.takeAll(into: &all)
        #expect(all == Array(0..<(Ring<Int>.keptCapacity * 2)))
        #expect(ring.capacity == 0)
    }

    /// Where it shows: a C program polling with `fq_engine_dispatch(e, max)`
    /// takes a few results at a time while more wait. A result taken must be
    /// let go once its callback returned, not held by the delivery queue's
    /// buffer until that buffer next empties (with no history, nothing else
    /// keeps it).
    @Test func aResultDispatchedInPollModeIsNotKeptByTheEngine() throws {
        final class Seen: @unchecked Sendable {  // written by callbacks on the test thread
            weak var first: OperationResult?
            var calls = 0
        }
        let seen = Seen()
        try withEngine(#"{"delivery": "poll", "history": 0}"#, queue: 1) { engine, queue, _ in
            for _ in 0..<3 {
                _ = try engine.submit(.block { _ in JSONRef(owned: json_integer(7)) }, to: queue, options: nil) { result in
                    if seen.calls == 0 { seen.first = result }
                    seen.calls += 1
                }
            }
            SubmitInboxTests.within10s { engine.delivery.waiting == 3 }
            #expect(engine.delivery.waiting == 3)
            #expect(try engine.dispatch(max: 1) == 1)
            #expect(seen.calls == 1)
            #expect(seen.first == nil)
            #expect(try engine.dispatch(max: 0) == 2)
            #expect(seen.calls == 3)
        }
    }
}
