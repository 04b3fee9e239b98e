; placement-logic proof obligation: memory/order-dp-zero1-strict
; theorem: Memory derivation
; DP > ZeRO-1 when N ≥ 2
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: model_state(DP) > model_state(ZeRO-1)
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
 (let ((?x11 (to_real N)))
 (<= 2.0 ?x11)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x11 (to_real N)))
 (and (distinct ?x11 0.0) true)))
(assert
 (let ((?x15 (* K psi)))
(let ((?x17 (* 4.0 psi)))
(let ((?x18 (+ ?x17 ?x15)))
(not (> ?x18 (+ ?x17 (* ?x15 (/ 1.0 (to_real N))))))))))
(check-sat)
(exit)
