/// A FIFO of values: a circular buffer whose capacity is a power of two.
/// Append and pop from the front are O(1) and touch one slot, and an
/// element taken out is no longer held by the ring (a delivered result, a
/// job's operation). The buffer doubles when full, moving its elements, and
/// is given back when it empties above `keptCapacity` slots (after a
/// flood). A value type: copies share the buffer until one of them changes.
struct Ring<Element> {
    private final class Buffer {
        let base: UnsafeMutablePointer<Element>
        let mask: Int
        var head = 0
        var count = 0

        init(capacity: Int) {
            base = .allocate(capacity: capacity)
            mask = capacity - 1
        }

        var capacity: Int { mask + 1 }
        /// Elements from `head` to the end of the buffer; the rest wrap to its start.
        var front: Int { Swift.min(count, capacity - head) }

        /// Moves (or copies) the elements, in order, to `target`.
        func transfer(to target: UnsafeMutablePointer<Element>, move: Bool) {
            if move {
                target.moveInitialize(from: base + head, count: front)
                (target + front).moveInitialize(from: base, count: count - front)
            } else {
                target.initialize(from: base + head, count: front)
                (target + front).initialize(from: base, count: count - front)
            }
        }

        deinit {
            (base + head).deinitialize(count: front)
            base.deinitialize(count: count - front)
            base.deallocate()
        }
    }

    private var buffer: Buffer?

    /// The largest buffer kept once the ring is empty.
    static var keptCapacity: Int { 4096 }

    var count: Int { buffer?.count ?? 0 }
    var isEmpty: Bool { count == 0 }
    var first: Element? {
        guard let buffer, buffer.count > 0 else { return nil }
        return buffer.base[buffer.head]
    }
    /// Slots allocated (for tests).
    var capacity: Int { buffer?.capacity ?? 0 }

    /// `consuming`: a caller that is done with `element` hands its
    /// reference over instead of copying it (one retain and release less).
    mutating func append(_ element: consuming Element) {
        // The buffer is used through an unretained reference: `writable`
        // made it this ring's own, and nothing here can release it.
        let slot = Unmanaged.passUnretained(writable(growing: true))._withUnsafeGuaranteedRef { buffer in
            let slot = buffer.base + ((buffer.head &+ buffer.count) & buffer.mask)
            buffer.count &+= 1
            return slot
        }
        slot.initialize(to: element)  // moved in, outside the closure (which would borrow it)
    }

    @discardableResult
    mutating func removeFirst() -> Element {
        precondition(count > 0, "removeFirst on an empty Ring")
        let (element, emptied) = Unmanaged.passUnretained(writable(growing: false))._withUnsafeGuaranteedRef { buffer in
            let element = (buffer.base + buffer.head).move()
            buffer.count &-= 1
            buffer.head = buffer.count == 0 ? 0 : (buffer.head &+ 1) & buffer.mask
            return (element, buffer.count == 0 && buffer.capacity > Self.keptCapacity)
        }
        if emptied { buffer = nil }
        return element
    }

    /// Moves every element, in order, to the end of `array`.
    mutating func takeAll(into array: inout [Element]) {
        let n = count
        guard n > 0 else { return }
        if array.isEmpty {
            let buffer = writable(growing: false)
            array = [Element](unsafeUninitializedCapacity: n) { target, initialized in
                buffer.transfer(to: target.baseAddress!, move: true)
                initialized = n
            }
            buffer.count = 0
            buffer.head = 0
            if buffer.capacity > Self.keptCapacity { self.buffer = nil }
        } else {
            array.reserveCapacity(array.count + n)
            while !isEmpty { array.append(removeFirst()) }
        }
    }

    /// The buffer, unshared, with room for one more element if `growing`.
    private mutating func writable(growing: Bool) -> Buffer {
        // Asked before any local reference to the buffer exists.
        let unique = isKnownUniquelyReferenced(&buffer)
        if unique, let current = buffer, !growing || current.count <= current.mask { return current }
        let count = buffer?.count ?? 0
        var capacity = Swift.max(8, buffer?.capacity ?? 0)
        while capacity < count + (growing ? 1 : 0) { capacity *= 2 }
        let fresh = Buffer(capacity: capacity)
        if let old = buffer {
            // A sole owner's elements move; a shared buffer's are copied.
            old.transfer(to: fresh.base, move: unique)
            if unique { old.count = 0 }
            fresh.count = count
        }
        buffer = fresh
        return fresh
    }
}

/// A binary min-heap ordered by `key`.
struct MinHeap<Element> {
    private var items: [(key: UInt64, value: Element)] = []

    var isEmpty: Bool { items.isEmpty }
    var count: Int { items.count }
    var min: (key: UInt64, value: Element)? { items.first }

    mutating func insert(_ value: Element, key: UInt64) {
        items.append((key, value))
        var child = items.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            if items[parent].key <= items[child].key { break }
            items.swapAt(parent, child)
            child = parent
        }
    }

    /// Removes every element `isGone` says, and makes a heap of the rest
    /// (O(n)).
    mutating func removeAll(where isGone: (Element) -> Bool) {
        items.removeAll { isGone($0.value) }
        var parent = items.count / 2
        while parent > 0 {
            parent -= 1
            siftDown(parent)
        }
    }

    @discardableResult
    mutating func removeMin() -> (key: UInt64, value: Element) {
        let top = items[0]
        let last = items.removeLast()
        if !items.isEmpty {
            items[0] = last
            siftDown(0)
        }
        return top
    }

    private mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = parent * 2 + 1
            let right = left + 1
            var smallest = parent
            if left < items.count && items[left].key < items[smallest].key { smallest = left }
            if right < items.count && items[right].key < items[smallest].key { smallest = right }
            if smallest == parent { break }
            items.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
