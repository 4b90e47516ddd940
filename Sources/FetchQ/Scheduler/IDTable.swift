/// A hash map from operation ids (> 0) to values, for the engine's hot
/// paths: Robin Hood linear probing with the id itself as the hash, and
/// backward-shift deletion. Swift's `Dictionary` hashes every key with
/// seeded SipHash, which the P1 benchmark's profile showed as the largest
/// single cost per op.
///
/// Ids are handed out in sequence and the live ones form a sliding window,
/// so with the id as its own hash nearly every key sits in its home bucket
/// and neighbours share cache lines. Robin Hood ordering matters here: with
/// plain linear probing a window of sequential ids is one long run, and a
/// backward-shift deletion had to walk to its end (a 100 000-op failure
/// chain took minutes); here a deletion stops at the first key that is home.
struct IDTable<Value> {
    /// 0 marks an empty bucket (ids are > 0).
    private var keys: [OpID]
    private var values: [Value?]
    private(set) var count = 0

    init() {
        keys = [OpID](repeating: 0, count: 16)
        values = [Value?](repeating: nil, count: 16)
    }

    var isEmpty: Bool { count == 0 }
    private var mask: Int { keys.count - 1 }

    @inline(__always)
    private func home(_ key: OpID) -> Int {
        Int(truncatingIfNeeded: key) & mask
    }

    /// How far bucket `i` is from the home of the key it holds.
    @inline(__always)
    private func distance(_ i: Int, _ key: OpID) -> Int {
        (i - home(key)) & mask
    }

    /// The bucket holding `key`, or nil.
    @inline(__always)
    private func find(_ key: OpID) -> Int? {
        var i = home(key)
        var d = 0
        while true {
            let k = keys[i]
            if k == key { return i }
            // Robin Hood invariant: `key` would have displaced a key closer
            // to its home than `d`.
            if k == 0 || distance(i, k) < d { return nil }
            i = (i + 1) & mask
            d += 1
        }
    }

    subscript(key: OpID) -> Value? {
        get { find(key).flatMap { values[$0] } }
        set {
            if let newValue { insert(key, newValue) } else { removeValue(forKey: key) }
        }
    }

    /// Inserts or replaces.
    mutating func insert(_ key: OpID, _ value: Value) {
        precondition(key > 0, "IDTable keys are > 0")
        if let i = find(key) {
            values[i] = value
            return
        }
        if (count + 1) * 10 > keys.count * 7 { grow() }
        var carriedKey = key
        var carriedValue: Value? = value
        var i = home(key)
        var d = 0
        while true {
            let k = keys[i]
            if k == 0 {
                keys[i] = carriedKey
                values[i] = carriedValue
                count += 1
                return
            }
            let dk = distance(i, k)
            if dk < d {
                // Take the bucket from a key nearer its home; carry that one on.
                keys[i] = carriedKey
                carriedKey = k
                swap(&carriedValue, &values[i])
                d = dk
            }
            i = (i + 1) & mask
            d += 1
        }
    }

    @discardableResult
    mutating func removeValue(forKey key: OpID) -> Value? {
        guard var hole = find(key) else { return nil }
        let removed = values[hole].take()
        count -= 1
        // Backward shift until an empty bucket or a key in its home bucket.
        while true {
            let next = (hole + 1) & mask
            let k = keys[next]
            if k == 0 || distance(next, k) == 0 { break }
            keys[hole] = k
            values[hole] = values[next].take()
            hole = next
        }
        keys[hole] = 0
        return removed
    }

    private mutating func grow() {
        let oldKeys = keys
        var oldValues = values
        let capacity = keys.count * 2
        keys = [OpID](repeating: 0, count: capacity)
        values = [Value?](repeating: nil, count: capacity)
        count = 0
        for i in oldKeys.indices where oldKeys[i] != 0 {
            insert(oldKeys[i], oldValues[i].take()!)
        }
    }

    /// Every key, in no particular order.
    var allKeys: [OpID] { keys.filter { $0 != 0 } }
}

/// Counts by queue id (ids are small and dense), 0 for a queue never counted.
struct QueueCounts {
    private var counts: [Int] = []

    subscript(queue: QueueID) -> Int {
        get { queue < counts.count ? counts[queue] : 0 }
        set {
            if queue >= counts.count { counts += [Int](repeating: 0, count: queue + 1 - counts.count) }
            counts[queue] = newValue
        }
    }
}

/// A growable buffer of initialized elements addressed by index, for the
/// scheduler's slab of operations. Unlike `Array`, whose getter copies an
/// element (retaining every reference it holds) before a field is read,
/// `base[i].field` reads or writes the field in place. No bounds checks:
/// indices come from `append`. A reference type: a copy of the scheduler
/// shares it (the engine never copies its scheduler).
final class Slab<Element> {
    private(set) var base: UnsafeMutablePointer<Element>
    private(set) var count = 0
    private var capacity = 64

    init() {
        base = .allocate(capacity: capacity)
    }

    deinit {
        base.deinitialize(count: count)
        base.deallocate()
    }

    /// Adds an element; returns its index.
    func append(_ element: consuming Element) -> Int {
        if count == capacity {
            let bigger = UnsafeMutablePointer<Element>.allocate(capacity: capacity * 2)
            bigger.moveInitialize(from: base, count: count)
            base.deallocate()
            base = bigger
            capacity *= 2
        }
        (base + count).initialize(to: element)
        count += 1
        return count - 1
    }
}
