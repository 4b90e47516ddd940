import CJansson
@testable import FetchQ
import Glibc
import Testing

/// Searches that upsert into the item store, end to end.
@Suite(.serialized) struct EngineStoreTests {
    let server: TestServer
    let directory: String

    init() throws {
        server = try TestServer()
        var template = Array("/tmp/fetchq-store-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        directory = String(cString: try #require(made))
    }

    func cleanUp() {
        for suffix in ["", "-wal", "-shm"] {
            for name in ["a.db", "b.db", "c.db"] { unlink(directory + "/" + name + suffix) }
        }
        rmdir(directory)
    }

    var config: String { server.searchConfig }

    func corpusIDs(tag: String) throws -> Set<String> {
        let (_, body) = try server.get("/corpus?tag=\(tag)")
        let doc = try JSONParser.parse(body, maxDepth: 64)
        let items = (doc.isArray ? doc : doc.at("/items") ?? doc.at("/results"))?.elements ?? []
        return Set(items.compactMap { $0.at("/id")?.stringValue })
    }

    @Test func searchUpsertsWithBothMergePolicies() throws {
        defer { cleanUp() }
        let path = directory + "/a.db"
        let expected = try corpusIDs(tag: "swift")
        try withEngine(config) { engine, queue, c in
            let first = try engine.search("swift", options: #"{"store": {"path": "\#(path)", "collection": "posts"}}"#, on: queue, c)
            let r1 = try #require(c.wait(first))
            #expect(r1.outcome == .succeeded)
            #expect(r1.value?.at("/store/inserted")?.integerValue == Int64(expected.count))
            #expect(r1.value?.at("/store/updated")?.integerValue == 0)

            // Change two stored items locally, then search again with each policy.
            let store = try ItemStore.shared(path: path)
            let someIDs = Array(expected.sorted().prefix(2))
            let local = json("[" + someIDs.map { #"{"id": "\#($0)", "text": "edited locally"}"# }.joined(separator: ",") + "]")
            _ = try store.upsert(collection: "posts", items: local, idPointer: try JSONPointer("/id"), merge: .overwrite)

            let keep = try engine.search("swift", options: #"{"store": {"path": "\#(path)", "collection": "posts", "merge": "keep-local"}}"#, on: queue, c)
            let rk = try #require(c.wait(keep))
            #expect(rk.value?.at("/store/inserted")?.integerValue == 0)
            #expect(rk.value?.at("/store/unchanged")?.integerValue == Int64(expected.count))
            #expect(try store.item(collection: "posts", id: someIDs[0])?.at("/text")?.stringValue == "edited locally")

            let over = try engine.search("swift", options: #"{"store": {"path": "\#(path)", "collection": "posts", "merge": "overwrite"}}"#, on: queue, c)
            let ro = try #require(c.wait(over))
            #expect(ro.value?.at("/store/updated")?.integerValue == 2)
            #expect(ro.value?.at("/store/unchanged")?.integerValue == Int64(expected.count - 2))
            #expect(try store.item(collection: "posts", id: someIDs[0])?.at("/text")?.stringValue != "edited locally")
            #expect(try store.count(collection: "posts") == expected.count)
        }
    }

    @Test func fiftyConcurrentSearchesLoseNothing() throws {
        defer { cleanUp() }
        let path = directory + "/b.db"
        let tags = ["swift", "c", "python", "rust", "go", "json", "http", "queue"]
        var union = Set<String>()
        for tag in tags { union.formUnion(try corpusIDs(tag: tag)) }
        try withEngine(config, queue: 16) { engine, queue, c in
            var ids: [OpID] = []
            for i in 0..<50 {
                ids.append(try engine.search(tags[i % tags.count],
                                             options: #"{"store": {"path": "\#(path)", "collection": "posts"}}"#, on: queue, c))
            }
            let results = try #require(c.waitAll(ids))
            #expect(results.allSatisfy { $0.outcome == .succeeded })
            let inserted = results.compactMap { $0.value?.at("/store/inserted")?.integerValue }.reduce(0, +)
            #expect(inserted == Int64(union.count))
        }
        // A fresh connection to the file sees exactly the corpus.
        let reopened = try ItemStore(path: path)
        #expect(try reopened.count(collection: "posts") == union.count)
        let stored = try reopened.items(collection: "posts").elements.compactMap { $0.at("/id")?.stringValue }
        #expect(Set(stored) == union)
        reopened.close()
    }

    /// The engine keeps its stores open; a search after the file was deleted
    /// stores into a new file at the path, not into the deleted one.
    @Test func aSearchAfterTheStoreFileWasDeletedWritesANewFile() throws {
        defer { cleanUp() }
        let path = directory + "/c.db"
        let expected = try corpusIDs(tag: "rust")
        try withEngine(config) { engine, queue, c in
            let options = #"{"store": {"path": "\#(path)", "collection": "posts"}}"#
            let first = try #require(c.wait(try engine.search("rust", options: options, on: queue, c)))
            #expect(first.value?.at("/store/inserted")?.integerValue == Int64(expected.count))
            for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
            let second = try #require(c.wait(try engine.search("rust", options: options, on: queue, c)))
            #expect(second.value?.at("/store/inserted")?.integerValue == Int64(expected.count))
            #expect(access(path, F_OK) == 0)
            #expect(try ItemStore(path: path).count(collection: "posts") == expected.count)
        }
    }

    /// Descriptors open on files in the test's directory.
    func openFilesInDirectory() -> Int {
        guard let fds = opendir("/proc/self/fd") else { return -1 }
        defer { closedir(fds) }
        var count = 0
        var target = [CChar](repeating: 0, count: 4096)
        while let entry = readdir(fds) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            let n = readlink("/proc/self/fd/" + name, &target, target.count - 1)
            guard n > 0 else { continue }
            target[n] = 0
            if String(cString: target).hasPrefix(directory + "/") { count += 1 }
        }
        return count
    }

    /// A service writing a file a day kept every file a search had used open
    /// until fq_engine_free (a soak review: 3 descriptors and about 125 KB
    /// per path, after the files were deleted too). The engine keeps the
    /// last `keptStores` open; older ones close when no search holds them.
    @Test func onlyTheStoresUsedLastStayOpen() throws {
        defer {
            for day in 0..<20 {
                for suffix in ["", "-wal", "-shm"] { unlink(directory + "/day-\(day).db" + suffix) }
            }
            cleanUp()
        }
        try withEngine(config) { engine, queue, c in
            for day in 0..<20 {
                let options = #"{"store": {"path": "\#(directory)/day-\#(day).db", "collection": "posts"}}"#
                let r = try #require(c.wait(try engine.search("rust", options: options, on: queue, c)))
                #expect(r.outcome == .succeeded)
            }
            #expect(engine.waitIdle(timeoutMs: 10_000) == .ok)
            #expect(engine.lock.withLock { engine.stores.count } == Engine.keptStores)
            let open = openFilesInDirectory()
            #expect(open > 0 && open <= Engine.keptStores * 3, "\(open) descriptors on store files")
            // The newest is still the one a search gets (kept, not reopened).
            let newest = try engine.store(path: directory + "/day-19.db")
            #expect(engine.lock.withLock { engine.stores.last === newest })
        }
        #expect(openFilesInDirectory() == 0)
    }

    /// Identical searches share one transfer (coalescing), but each writes
    /// its own store: with different paths every file gets the items.
    @Test func coalescedSearchesEachWriteTheirOwnStore() throws {
        defer { cleanUp() }
        let expected = try corpusIDs(tag: "swift")
        try withEngine(config) { engine, queue, c in
            try server.resetStats()
            queue.setSuspended(true)
            let ids = try ["a.db", "b.db", "c.db"].map { name in
                try engine.search("swift", options: #"{"store": {"path": "\#(directory)/\#(name)", "collection": "posts"}}"#,
                                  on: queue, c)
            }
            queue.setSuspended(false)
            for id in ids {
                let r = try #require(c.wait(id))
                #expect(r.outcome == .succeeded)
                #expect(r.value?.at("/store/inserted")?.integerValue == Int64(expected.count))
            }
            for name in ["a.db", "b.db", "c.db"] {
                #expect(try ItemStore(path: directory + "/" + name).count(collection: "posts") == expected.count, "\(name)")
            }
            #expect(try server.stats()["requests"] == 1)  // one shared transfer
        }
    }

    /// Results the store cannot take (not objects) are the store's failure,
    /// FQ_ERR_STORE, not FQ_ERR_INVALID (which says the caller erred).
    @Test func resultsThatAreNotObjectsAreAStoreFailure() throws {
        defer {
            unlink(directory + "/strings.json")
            cleanUp()
        }
        let file = fopen(directory + "/strings.json", "w")
        fputs(#"{"results": ["a", {"id": 1}]}"#, file)
        fclose(file)
        let files = try TestServer(files: directory)
        let path = directory + "/b.db"
        try withEngine(config) { engine, queue, c in
            let id = try engine.search("x", options: #"{"url": "\#(files.url("/file/strings.json"))?q={query}", "#
                                           + #""results": "/results", "store": {"path": "\#(path)", "collection": "c"}}"#,
                                       on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .failed)
            #expect(r.status == .store, "\(r.status) \(r.message ?? "")")
            #expect(r.message?.contains("item 0 is a string, not an object") == true, "\(r.message ?? "")")
            #expect(try ItemStore.shared(path: path).count(collection: "c") == 0)  // nothing of the batch
        }
    }

    @Test func badStoreOptionsFailAtSubmit() throws {
        defer { cleanUp() }
        try withEngine(config) { engine, queue, c in
            for options in [#"{"store": {"collection": "x"}}"#,
                            #"{"store": {"path": "\#(directory)/c.db"}}"#,
                            #"{"store": {"path": "\#(directory)/c.db", "collection": "x", "merge": "mine"}}"#,
                            #"{"store": {"path": "\#(directory)/c.db", "collection": "x", "extra": 1}}"#,
                            #"{"store": {"path": "/nonexistent-dir/x.db", "collection": "x"}}"#] {
                #expect(throws: FetchQError.self, "\(options)") { _ = try engine.search("swift", options: options, on: queue, c) }
            }
            #expect(c.count == 0)
        }
    }
}
