import CJansson
import Glibc
import Synchronization
import Testing

@testable import FetchQ

/// Values made on a worker go back to that worker to be freed (ReleaseList).
@Suite struct ReleaseListTests {
    func refcount(_ value: UnsafeMutablePointer<json_t>) -> Int {
        Int(value.pointee.refcount)
    }

    /// A json_t passed into a @Sendable closure as its address.
    func pointer(_ bits: UInt) -> UnsafeMutablePointer<json_t> {
        UnsafeMutablePointer<json_t>(bitPattern: bits)!
    }

    /// A value with one extra reference of ours, so its count can be watched.
    func watched() -> (UnsafeMutablePointer<json_t>, JSONRef) {
        let raw = json_object()!
        json_incref(raw)
        return (raw, JSONRef(owned: raw)!)
    }

    @Test func takesOnlyWhileOpenAndDrainReleases() {
        let list = ReleaseList()
        let (raw, value) = watched()
        #expect(!list.take(value))  // a new list is closed: its owner is not running
        list.open()
        #expect(list.take(value))
        _ = consume value
        #expect(refcount(raw) == 2)  // held by the list
        list.drain()
        #expect(refcount(raw) == 1)
        let (raw2, value2) = watched()
        #expect(list.take(value2))
        _ = consume value2
        list.close()  // frees what it holds, takes nothing more
        #expect(refcount(raw2) == 1)
        let (raw3, value3) = watched()
        #expect(!list.take(value3))
        json_decref(raw)
        json_decref(raw2)
        json_decref(raw3)
    }

    /// Runs `body` on a new thread whose release list is `list` (as a worker's).
    func onOwner(_ list: ReleaseList, _ body: @escaping @Sendable () -> Void) {
        joinThread(try! startThread(name: "release-test") {
            list.makeCurrent()
            body()
        })
    }

    final class Box: @unchecked Sendable { var result: OperationResult? }

    /// A result holding `raw` (one reference stolen), made on `list`'s owner thread.
    func resultMadeByOwner(_ list: ReleaseList, _ raw: UnsafeMutablePointer<json_t>) -> Box {
        let bits = UInt(bitPattern: raw)
        let box = Box()
        onOwner(list) {
            box.result = OperationResult(id: 1, outcome: .succeeded, status: .ok, message: nil,
                                         value: JSONRef(owned: self.pointer(bits)))
        }
        return box
    }

    @Test func resultFreedElsewhereHandsItsValueBack() {
        let list = ReleaseList()
        list.open()
        let raw = json_object()!
        json_incref(raw)
        let box = resultMadeByOwner(list, raw)
        #expect(refcount(raw) == 2)
        box.result = nil  // the last reference goes on this thread, not the owner's
        #expect(refcount(raw) == 2)  // the value waits for its owner
        list.drain()
        #expect(refcount(raw) == 1)
        json_decref(raw)
    }

    @Test func resultFreedOnItsOwnerOrWithNoOwnerFreesAtOnce() {
        let list = ReleaseList()
        list.open()
        let raw = json_object()!
        json_incref(raw)
        let bits = UInt(bitPattern: raw)
        onOwner(list) {
            var result: OperationResult? = OperationResult(id: 1, outcome: .succeeded, status: .ok, message: nil,
                                                           value: JSONRef(owned: pointer(bits)))
            _ = result?.id
            result = nil
        }
        #expect(refcount(raw) == 1)
        // Made on a thread that is not a worker: no owner, freed where it goes.
        json_incref(raw)
        var plain: OperationResult? = OperationResult(id: 2, outcome: .succeeded, status: .ok, message: nil,
                                                      value: JSONRef(owned: raw))
        _ = plain?.id
        plain = nil
        #expect(refcount(raw) == 1)
        json_decref(raw)
    }

    /// An owner that closed (asleep or gone) takes nothing: the value is freed
    /// by whoever lets the result go.
    @Test func closedOwnerTakesNothing() {
        let list = ReleaseList()
        list.open()
        let raw = json_object()!
        json_incref(raw)
        let box = resultMadeByOwner(list, raw)
        list.close()
        box.result = nil
        #expect(refcount(raw) == 1)
        json_decref(raw)
    }

    // MARK: - Response parts (lock-free)

    func parts() -> HTTPDetails { HTTPDetails(response: nil, queueWaitMs: 0, attempts: 1, fromCache: false) }

    /// A weak reference that can cross threads.
    final class Watch: @unchecked Sendable {
        weak var parts: HTTPDetails?
        init(_ parts: HTTPDetails) { self.parts = parts }
    }

    @Test func responsePartsGoBackOnlyWhileOpen() {
        let list = ReleaseList()
        var first: HTTPDetails? = parts()
        let watchFirst = Watch(first!)
        #expect(!list.take(first!))  // a new list is closed
        list.open()
        #expect(list.take(first!))
        first = nil
        #expect(watchFirst.parts != nil)  // held by the list
        list.drain()
        #expect(watchFirst.parts == nil)
        var second: HTTPDetails? = parts()
        let watchSecond = Watch(second!)
        #expect(list.take(second!))
        second = nil
        list.close()  // frees what it holds, takes nothing more
        #expect(watchSecond.parts == nil)
        let third = parts()
        #expect(!list.take(third))
    }

    /// Results can share their response parts: the parts go on one stack
    /// once; a second take while they are there is refused (its reference is
    /// dropped by the caller), and after the owner took them off they can go
    /// back again.
    @Test func sharedResponsePartsGoOnTheStackOnce() {
        let list = ReleaseList()
        let other = ReleaseList()
        list.open()
        other.open()
        var shared: HTTPDetails? = parts()
        let watch = Watch(shared!)
        #expect(list.take(shared!))
        #expect(!list.take(shared!))   // on the stack already
        #expect(!other.take(shared!))  // on another list's stack: refused too
        list.drain()                   // drops the stack's reference only
        #expect(watch.parts != nil)
        #expect(other.take(shared!))   // off the stack: it can go back
        shared = nil
        #expect(watch.parts != nil)    // held by `other`
        other.drain()
        #expect(watch.parts == nil)
        list.close()
        other.close()
    }

    /// Two results sharing parts, dropped on other threads at the same time
    /// as the owner drains: freed once, after both.
    @Test func sharedPartsDroppedConcurrentlyAreFreedOnce() {
        let watches = handBackUnderLoad(takes: 3, closeEvery: nil)
        #expect(watches.count == 8_000)
        #expect(watches.allSatisfy { $0.parts == nil })
    }

    @Test func resultFreedElsewhereHandsItsResponsePartsBack() {
        let list = ReleaseList()
        list.open()
        let box = Box()
        let watch = TestCollector<Watch>()
        onOwner(list) {
            let result = OperationResult(id: 1, outcome: .succeeded, status: .ok, message: nil, value: nil,
                                         http: HTTPInfo(queueWaitMs: 0, attempts: 1))
            watch.add(Watch(result.http!.details))
            box.result = result
        }
        box.result = nil  // the last reference goes on this thread, not the owner's
        #expect(watch.all[0].parts != nil)  // the parts wait for their owner
        list.drain()
        #expect(watch.all[0].parts == nil)
    }

    /// Pushers on four threads while the owner opens, drains and closes on
    /// its own: every part is freed exactly once (a part freed twice would
    /// crash; one left over would still be alive at the end).
    @Test func concurrentHandBacksAreEachFreedOnce() {
        let watches = handBackUnderLoad(takes: 1, closeEvery: 3)
        #expect(watches.count == 8_000)
        #expect(watches.allSatisfy { $0.parts == nil })
    }

    /// Four threads hand back 2 000 parts each, `takes` times per part (as
    /// that many results sharing it would), while an owner thread opens and
    /// drains its list until they are done, closing it every `closeEvery`
    /// rounds when given. Returns a watch on every part.
    func handBackUnderLoad(takes: Int, closeEvery: Int?) -> [Watch] {
        let list = ReleaseList()
        let watches = TestCollector<Watch>()
        let stop = Atomic<Bool>(false)
        let owner = try! startThread(name: "release-owner") {
            list.makeCurrent()
            var round = 0
            while !stop.load(ordering: .acquiring) && round < 10_000_000 {
                round += 1
                list.open()
                list.drain()
                if let closeEvery, round % closeEvery == 0 { list.close() }
            }
            list.close()
        }
        runThreads(4) { _ in
            for _ in 0..<2_000 {
                let p = self.parts()
                watches.add(Watch(p))
                for _ in 0..<takes { _ = list.take(p) }  // false: this thread lets it go
            }
        }
        stop.store(true, ordering: .releasing)
        joinThread(owner)
        return watches.all
    }
}
