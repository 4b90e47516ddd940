/// A FIFO of values: amortised O(1) append and pop from the front.
/// The front is an index into storage that is compacted when half is dead.
struct Ring<Element> {
    private var storage: [Element] = []
    private var head = 0

    var isEmpty: Bool { head == storage.count }
    var count: Int { storage.count - head }
    var first: Element? { isEmpty ? nil : storage[head] }

    mutating func append(_ element: Element) { storage.append(element) }

    /// Moves every element, in order, to the end of `array` (which should
    /// be empty: then the storage itself changes hands, nothing is copied,
    /// and the ring keeps `array`'s old buffer).
    mutating func takeAll(into array: inout [Element]) {
        if head == 0 && array.isEmpty {
            swap(&storage, &array)
        } else {
            array.append(contentsOf: storage[head...])
            storage.removeAll(keepingCapacity: storage.count < 4096)
        }
        head = 0
    }

    @discardableResult
    mutating func removeFirst() -> Element {
        let element = storage[head]
        head += 1
        if head == storage.count {
            storage.removeAll(keepingCapacity: storage.count < 4096)
            head = 0
        } else if head >= 1024 && head * 2 >= storage.count {
            storage.removeFirst(head)
            head = 0
        }
        return element
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

    @discardableResult
    mutating func removeMin() -> (key: UInt64, value: Element) {
        let top = items[0]
        let last = items.removeLast()
        if !items.isEmpty {
            items[0] = last
            var parent = 0
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
        return top
    }
}
