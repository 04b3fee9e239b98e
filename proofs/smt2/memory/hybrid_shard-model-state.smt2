; placement-logic proof obligation: memory/hybrid_shard-model-state
; theorem: Memory derivation
; FSDP HYBRID_SHARD model state = (4 + K)Ψ/N_shard
;   ∀ Ψ > 0, K > 0, N, R ∈ ℤ, N, R ≥ 1: model_state(HYBRID_SHARD over (R, N)) = (2 + 2 + K)Ψ/N
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun R () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x12 (to_real N)))
 (<= 1.0 ?x12)))
(assert
 (let ((?x14 (to_real R)))
 (<= 1.0 ?x14)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x12 (to_real N)))
 (and (distinct ?x12 0.0) true)))
(assert
 (let ((?x12 (to_real N)))
 (and (distinct ?x12 0.0) true)))
(assert
 (let ((?x24 (+ (* (* 4.0 psi) (/ 1.0 (to_real N))) (* (* K psi) (/ 1.0 (to_real N))))))
(not (= ?x24 (* (* psi (/ 1.0 (to_real N))) (+ 4.0 K))))))
(check-sat)
(exit)
