@testable import FetchQ
import Testing

/// The engine's id hash table against Swift's Dictionary as the reference.
@Suite struct IDTableTests {
    func check(_ table: IDTable<Int>, _ reference: [OpID: Int]) {
        #expect(table.count == reference.count)
        for (key, value) in reference { #expect(table[key] == value) }
        #expect(Set(table.allKeys) == Set(reference.keys))
    }

    @Test func slidingWindowOfSequentialIDs() {
        // The engine's pattern: ids submitted in order, finished roughly in order.
        var table = IDTable<Int>()
        var reference: [OpID: Int] = [:]
        var g = SplitMix(seed: 1)
        var next: OpID = 1
        for round in 0..<20_000 {
            table[next] = round
            reference[next] = round
            next += 1
            if reference.count > 300, let victim = reference.keys.min(by: { _, _ in g.next() & 1 == 0 }) {
                #expect(table.removeValue(forKey: victim) == reference.removeValue(forKey: victim))
            }
        }
        check(table, reference)
    }

    /// P1 with priorities: ids are submitted in order ahead of the workers,
    /// which end the highest priority first, so old ids of low priority stay
    /// while the newest pass the table's size and wrap onto them. Without
    /// growing on a long run, probes grew to thousands of buckets here at a
    /// load just under the 70 % that makes the table grow.
    @Test func oldIDsLeftBehindDoNotMakeLongRuns() {
        var table = IDTable<Int>()
        var reference: [OpID: Int] = [:]
        var waiting = [[OpID]](repeating: [], count: 5)
        var heads = [Int](repeating: 0, count: 5)
        var longest = 0
        for id in OpID(1)...OpID(200_000) {
            table[id] = Int(id)
            reference[id] = Int(id)
            waiting[Int(id % 5)].append(id)
            // 7 ends per 20 submits, the highest priority (4) first.
            if id % 20 < 7, let p = (0..<5).reversed().first(where: { heads[$0] < waiting[$0].count }) {
                let done = waiting[p][heads[p]]
                heads[p] += 1
                #expect(table.removeValue(forKey: done) == reference.removeValue(forKey: done))
            }
            if id % 2_000 == 0 { longest = max(longest, table.longestProbe) }
        }
        check(table, reference)
        #expect(longest <= IDTable<Int>.longRun + 1)
        #expect(table.capacity <= 8 * table.count)  // grown only while at least a quarter full
    }

    @Test func keysThatShareABucketAcrossGrowth() {
        // Ids that differ by multiples of the capacity land on the same home
        // bucket: probing, wrap-around at the end and backward-shift deletion.
        var table = IDTable<Int>()
        var reference: [OpID: Int] = [:]
        let keys: [OpID] = (0..<40).map { 15 + OpID($0) * 16 } + (0..<40).map { 1 + OpID($0) * 1024 }
        for (i, k) in keys.enumerated() {
            table[k] = i
            reference[k] = i
        }
        check(table, reference)
        for k in keys where k % 3 == 0 {
            #expect(table.removeValue(forKey: k) == reference.removeValue(forKey: k))
            check(table, reference)
        }
        for k in keys { table[k] = nil; reference[k] = nil }
        check(table, reference)
        #expect(table.isEmpty)
    }

    @Test func randomOperationsMatchADictionary() {
        var table = IDTable<Int>()
        var reference: [OpID: Int] = [:]
        var g = SplitMix(seed: 42)
        for step in 0..<50_000 {
            let key = OpID(g.next() % 2_000) + 1
            switch g.next() % 3 {
            case 0, 1:
                table[key] = step
                reference[key] = step
            default:
                #expect(table.removeValue(forKey: key) == reference.removeValue(forKey: key))
            }
            if step % 5_000 == 0 { check(table, reference) }
        }
        check(table, reference)
        #expect(table.removeValue(forKey: 999_999) == nil)
        #expect(table[0 + 999_999] == nil)
    }
}
