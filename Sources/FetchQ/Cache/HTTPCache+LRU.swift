extension HTTPCache {
    /// The entries held in memory, in recency order: a doubly linked list threaded through
    /// an array of slots (indices, not references, so no ARC traffic), with a dictionary
    /// from key to slot. Every operation is O(1) (amortized for the dictionary and the
    /// slot array). Not thread-safe: ``HTTPCache`` uses it under its mutex.
    struct RecencyList {
        struct Node {
            var key: String
            var entry: Entry?  // nil in a free slot, so a freed body is released at once
            var cost: Int
            var newer: Int  // toward the head (most recently used); -1 = none
            var older: Int  // toward the tail (least recently used); -1 = none
        }

        private(set) var nodes: [Node] = []
        private var freeSlots: [Int] = []
        private var slots: [ExactString: Int] = [:]  // a key's header values may differ only in form
        /// Most recently used slot, or -1.
        private(set) var head = -1
        /// Least recently used slot, or -1.
        private(set) var tail = -1
        /// Sum of the costs of the entries in the list.
        private(set) var bytes = 0

        var count: Int { slots.count }

        func slot(of key: String) -> Int? { slots[ExactString(key)] }

        func entry(at slot: Int) -> Entry { nodes[slot].entry! }

        func key(at slot: Int) -> String { nodes[slot].key }

        func cost(at slot: Int) -> Int { nodes[slot].cost }

        /// Adds `key` (not in the list) as the most recently used entry.
        @discardableResult
        mutating func insert(_ key: String, _ entry: Entry, cost: Int) -> Int {
            let node = Node(key: key, entry: entry, cost: cost, newer: -1, older: head)
            let slot: Int
            if let free = freeSlots.popLast() {
                slot = free
                nodes[slot] = node
            } else {
                slot = nodes.count
                nodes.append(node)
            }
            if head >= 0 { nodes[head].newer = slot }
            head = slot
            if tail < 0 { tail = slot }
            slots[ExactString(key)] = slot
            bytes += cost
            return slot
        }

        /// Replaces the entry in `slot` (same key) and makes it the most recently used.
        mutating func replace(at slot: Int, _ entry: Entry, cost: Int) {
            bytes += cost - nodes[slot].cost
            nodes[slot].entry = entry
            nodes[slot].cost = cost
            touch(slot)
        }

        /// Makes `slot` the most recently used entry.
        mutating func touch(_ slot: Int) {
            guard slot != head else { return }
            unlink(slot)
            nodes[slot].older = head
            nodes[slot].newer = -1
            if head >= 0 { nodes[head].newer = slot }
            head = slot
            if tail < 0 { tail = slot }
        }

        /// Removes `slot` and returns its key and cost.
        @discardableResult
        mutating func remove(at slot: Int) -> (key: String, cost: Int) {
            unlink(slot)
            let removed = (key: nodes[slot].key, cost: nodes[slot].cost)
            nodes[slot] = Node(key: "", entry: nil, cost: 0, newer: -1, older: -1)
            freeSlots.append(slot)
            slots[ExactString(removed.key)] = nil
            bytes -= removed.cost
            return removed
        }

        mutating func removeAll() {
            self = RecencyList()
        }

        /// Every key held, in no particular order.
        var keys: [String] { slots.keys.map(\.value) }

        /// Keys from the most to the least recently used (for tests and diagnostics).
        var keysByRecency: [String] {
            var keys: [String] = []
            var slot = head
            while slot >= 0 {
                keys.append(nodes[slot].key)
                slot = nodes[slot].older
            }
            return keys
        }

        /// Checks the links, the key index and the byte count; returns what is wrong.
        func consistencyProblems() -> [String] {
            var problems: [String] = []
            var walked = 0
            var total = 0
            var slot = head
            var previous = -1
            while slot >= 0, walked <= nodes.count {
                let node = nodes[slot]
                if node.newer != previous { problems.append("slot \(slot): wrong back link") }
                if slots[ExactString(node.key)] != slot { problems.append("slot \(slot): not indexed") }
                if node.entry == nil { problems.append("slot \(slot): free slot linked") }
                total += node.cost
                walked += 1
                previous = slot
                slot = node.older
            }
            if previous != tail { problems.append("tail is not the last node") }
            if walked != slots.count { problems.append("\(walked) linked, \(slots.count) indexed") }
            if total != bytes { problems.append("costs add up to \(total), not \(bytes)") }
            return problems
        }

        private mutating func unlink(_ slot: Int) {
            let newer = nodes[slot].newer
            let older = nodes[slot].older
            if newer >= 0 { nodes[newer].older = older } else if head == slot { head = older }
            if older >= 0 { nodes[older].newer = newer } else if tail == slot { tail = newer }
            nodes[slot].newer = -1
            nodes[slot].older = -1
        }
    }

    /// Entries stored in the file by an earlier instance and not loaded into memory yet
    /// ("cold"), oldest first. They count toward `maxBytes` and are evicted before any entry
    /// in memory: nothing has used them since this instance opened the file. Only shrinks.
    struct ColdIndex {
        private var sizes: [ExactString: Int] = [:]
        /// Oldest first; keys no longer in `sizes` are skipped when popping.
        private var order: [String] = []
        private var next = 0
        private(set) var bytes = 0

        var count: Int { sizes.count }

        /// `rows` oldest first.
        init(rows: [(key: String, size: Int)] = []) {
            for row in rows where sizes[ExactString(row.key)] == nil {
                sizes[ExactString(row.key)] = row.size
                order.append(row.key)
                bytes += row.size
            }
        }

        func contains(_ key: String) -> Bool { sizes[ExactString(key)] != nil }

        /// Every key not loaded yet, in no particular order.
        var keys: [String] { sizes.keys.map(\.value) }

        /// Forgets `key` (loaded into memory, replaced, or removed); returns its size.
        @discardableResult
        mutating func remove(_ key: String) -> Int? {
            guard let size = sizes.removeValue(forKey: ExactString(key)) else { return nil }
            bytes -= size
            compactIfDrained()
            return size
        }

        /// Removes and returns the oldest cold entry.
        mutating func popOldest() -> (key: String, size: Int)? {
            while next < order.count {
                let key = order[next]
                next += 1
                if let size = sizes.removeValue(forKey: ExactString(key)) {
                    bytes -= size
                    compactIfDrained()
                    return (key, size)
                }
            }
            return nil
        }

        private mutating func compactIfDrained() {
            if sizes.isEmpty {
                order = []
                next = 0
            }
        }
    }
}
