@testable import FetchQ
import Testing

/// The engine's id hash table against Swift's Dictionary as the reference.
@Suite struct IDTableTests {
    /// A small deterministic generator (SplitMix64), so failures reproduce.
    struct Generator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    func check(_ table: IDTable<Int>, _ reference: [OpID: Int]) {
        #expect(table.count == reference.count)
        for (key, value) in reference { #expect(table[key] == value) }
        #expect(Set(table.allKeys) == Set(reference.keys))
    }

    @Test func slidingWindowOfSequentialIDs() {
        // The engine's pattern: ids submitted in order, finished roughly in order.
        var table = IDTable<Int>()
        var reference: [OpID: Int] = [:]
        var g = Generator(state: 1)
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
        var g = Generator(state: 42)
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
