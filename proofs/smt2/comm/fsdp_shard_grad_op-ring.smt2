; placement-logic proof obligation: comm/fsdp_shard_grad_op-ring
; theorem: Communication derivation
; FSDP SHARD_GRAD_OP ring = 1 × DP
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: comm(FSDP SHARD_GRAD_OP) / comm(DP) = 1
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x0 (to_real N)))
 (<= 2.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x1 (+ (- 2.0) (* 2.0 (to_real N)))))
 (and (distinct ?x1 0.0) true)))
(assert
 (let ((?x2 (* (* 2.0 (/ 1.0 (+ (- 2.0) (* 2.0 (to_real N))))) (+ (- 1.0) (to_real N)))))
(not (= 1.0 ?x2))))
(check-sat)
(exit)
