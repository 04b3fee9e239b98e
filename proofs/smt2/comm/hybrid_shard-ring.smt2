; placement-logic proof obligation: comm/hybrid_shard-ring
; theorem: Communication derivation
; HYBRID_SHARD ring = 3(N−1)/N·2Ψ + 2(R−1)/R·2Ψ/N
;   ∀ Ψ > 0, N, R ∈ ℤ, N, R ≥ 1: comm(HYBRID_SHARD) = 3(N − 1)/N · 2Ψ + 2(R − 1)/R · 2Ψ/N (gather in forward and backward and reduce-scatter in the shard group, all-reduce of the shard across replicas)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun N () Int)
(declare-fun R () Int)
(declare-fun psi () Real)
(assert
 (let ((?x9 (to_real N)))
 (<= 1.0 ?x9)))
(assert
 (let ((?x11 (to_real R)))
 (<= 1.0 ?x11)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x9 (to_real N)))
 (and (distinct ?x9 0.0) true)))
(assert
 (let ((?x11 (to_real R)))
 (and (distinct ?x11 0.0) true)))
(assert
 (let ((?x9 (to_real N)))
 (and (distinct ?x9 0.0) true)))
(assert
 (let ((?x11 (to_real R)))
 (and (distinct ?x11 0.0) true)))
(assert
 (let ((?x11 (to_real R)))
(let ((?x21 (/ 1.0 ?x11)))
(let ((?x9 (to_real N)))
(let ((?x22 (/ 1.0 ?x9)))
(let ((?x24 (* (* 2.0 psi) ?x22)))
(let ((?x26 (* (* ?x24 ?x21) (+ (- 2.0) (* 2.0 ?x11)))))
(let (($x40 (= (+ (* (* (* 6.0 psi) ?x22) (+ (- 1.0) ?x9)) ?x26) (+ (* ?x24 (+ (- 3.0) (* 3.0 ?x9))) ?x26))))
(not $x40)))))))))
(check-sat)
(exit)
