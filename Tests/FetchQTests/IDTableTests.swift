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
