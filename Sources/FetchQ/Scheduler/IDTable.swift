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
    /// A key and its value side by side: a probe reads one cache line.
    /// Key 0 marks an empty bucket (ids are > 0).
    private struct Bucket {
        var key: OpID = 0
        var value: Value? = nil
    }

    private var buckets: [Bucket]
    private(set) var count = 0

    init() {
        buckets = [Bucket](repeating: Bucket(), count: 16)
    }

    var isEmpty: Bool { count == 0 }
    private var mask: Int { buckets.count - 1 }

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
            let k = buckets[i].key
            if k == key { return i }
            // Robin Hood invariant: `key` would have displaced a key closer
            // to its home than `d`.
            if k == 0 || distance(i, k) < d { return nil }
            i = (i + 1) & mask
            d += 1
        }
    }

    subscript(key: OpID) -> Value? {
        get { find(key).flatMap { buckets[$0].value } }
        set {
            if let newValue { insert(key, newValue) } else { removeValue(forKey: key) }
        }
    }

    /// Inserts or replaces, in one probe: until it displaces another key,
    /// the probe passes every bucket where `key` could be (as `find` does).
    mutating func insert(_ key: OpID, _ value: Value) {
        precondition(key > 0, "IDTable keys are > 0")
        if (count + 1) * 10 > buckets.count * 7 { grow() }
        var carried = Bucket(key: key, value: value)
        var i = home(key)
        var d = 0
        var longest = 0
        var displaced = false
        while true {
            let k = buckets[i].key
            if k == 0 {
                buckets[i] = carried
                count += 1
                // Live ids spread over more than the table (an old operation
                // still waits while newer ones come and go: P1 with priorities)
                // wrap onto each other and form long runs; more buckets undo
                // that. Only while at least a quarter full (so never more than
                // 8 buckets per key): a long run at a lower load is left as it is.
                if max(longest, d) > Self.longRun && count * 4 > buckets.count { grow() }
                return
            }
            if !displaced && k == key {
                buckets[i].value = carried.value
                return
            }
            let dk = distance(i, k)
            if dk < d {
                displaced = true
                // Take the bucket from a key nearer its home; carry that one on.
                swap(&carried, &buckets[i])
                longest = max(longest, d)
                d = dk
            }
            i = (i + 1) & mask
            d += 1
        }
    }

    /// A probe this long makes a table at least a quarter full grow.
    static var longRun: Int { 32 }

    @discardableResult
    mutating func removeValue(forKey key: OpID) -> Value? {
        guard var hole = find(key) else { return nil }
        let removed = buckets[hole].value.take()
        count -= 1
        // Backward shift until an empty bucket or a key in its home bucket.
        while true {
            let next = (hole + 1) & mask
            let k = buckets[next].key
            if k == 0 || distance(next, k) == 0 { break }
            buckets[hole].key = k
            buckets[hole].value = buckets[next].value.take()
            hole = next
        }
        buckets[hole].key = 0
        return removed
    }

    private mutating func grow() {
        var old = [Bucket](repeating: Bucket(), count: buckets.count * 2)
        swap(&old, &buckets)
        count = 0
        for i in old.indices where old[i].key != 0 {
            insert(old[i].key, old[i].value.take()!)
        }
    }

    /// Every key, in no particular order.
    var allKeys: [OpID] { buckets.compactMap { $0.key != 0 ? $0.key : nil } }

    /// The farthest any key sits from its home bucket, and the number of
    /// buckets (for tests).
    var longestProbe: Int { buckets.indices.map { buckets[$0].key == 0 ? 0 : distance($0, buckets[$0].key) }.max() ?? 0 }
    var capacity: Int { buckets.count }
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

    /// Called on each element before the slab frees them (for elements that
    /// hold references by hand).
    var willDeinitialize: ((inout Element) -> Void)? = nil

    deinit {
        if let willDeinitialize {
            for i in 0..<count { willDeinitialize(&base[i]) }
        }
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
