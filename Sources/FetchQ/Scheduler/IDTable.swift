/// A hash map from operation ids (> 0) to values, for the engine's hot
/// paths: open addressing with linear probing, a multiplicative (Fibonacci)
/// hash and backward-shift deletion, so lookups cost a multiply and a probe
/// or two. Swift's `Dictionary` hashes every key with seeded SipHash, which
/// the P1 benchmark's profile showed as the largest single cost per op.
struct IDTable<Value> {
    /// 0 marks an empty bucket (ids are > 0).
    private var keys: [OpID]
    private var values: [Value?]
    private(set) var count = 0
    private var shift: UInt64

    init() {
        keys = [OpID](repeating: 0, count: 16)
        values = [Value?](repeating: nil, count: 16)
        shift = 64 - 4
    }

    var isEmpty: Bool { count == 0 }
    private var mask: Int { keys.count - 1 }

    @inline(__always)
    private func home(_ key: OpID) -> Int {
        Int(truncatingIfNeeded: (UInt64(bitPattern: key) &* 0x9E37_79B9_7F4A_7C15) >> shift)
    }

    /// The bucket holding `key`, or nil.
    @inline(__always)
    private func find(_ key: OpID) -> Int? {
        var i = home(key)
        while true {
            let k = keys[i]
            if k == key { return i }
            if k == 0 { return nil }
            i = (i + 1) & mask
        }
    }

    subscript(key: OpID) -> Value? {
        get { find(key).flatMap { values[$0] } }
        set {
            if let newValue { insert(key, newValue) } else { removeValue(forKey: key) }
        }
    }

    func contains(_ key: OpID) -> Bool { find(key) != nil }

    /// Inserts or replaces.
    mutating func insert(_ key: OpID, _ value: Value) {
        precondition(key > 0, "IDTable keys are > 0")
        if (count + 1) * 10 > keys.count * 7 { grow() }
        var i = home(key)
        while true {
            let k = keys[i]
            if k == key {
                values[i] = value
                return
            }
            if k == 0 {
                keys[i] = key
                values[i] = value
                count += 1
                return
            }
            i = (i + 1) & mask
        }
    }

    @discardableResult
    mutating func removeValue(forKey key: OpID) -> Value? {
        guard var hole = find(key) else { return nil }
        let removed = values[hole]
        count -= 1
        // Backward shift: pull later entries of the probe run into the hole
        // when their home is not between the hole and themselves.
        var i = hole
        while true {
            i = (i + 1) & mask
            let k = keys[i]
            if k == 0 { break }
            let h = home(k)
            let movable = hole <= i ? (h <= hole || h > i) : (h <= hole && h > i)
            if movable {
                keys[hole] = k
                values[hole] = values[i]
                hole = i
            }
        }
        keys[hole] = 0
        values[hole] = nil
        return removed
    }

    private mutating func grow() {
        let oldKeys = keys
        var oldValues = values
        let capacity = keys.count * 2
        keys = [OpID](repeating: 0, count: capacity)
        values = [Value?](repeating: nil, count: capacity)
        shift -= 1
        count = 0
        for i in oldKeys.indices where oldKeys[i] != 0 {
            insert(oldKeys[i], oldValues[i].take()!)
        }
    }

    /// Every key, in no particular order.
    var allKeys: [OpID] { keys.filter { $0 != 0 } }

    /// Every value, in no particular order.
    var allValues: [Value] { values.compactMap { $0 } }

    mutating func removeAll() {
        self = IDTable()
    }
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
