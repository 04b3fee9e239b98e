; placement-logic proof obligation: memory/zero3-k12
; theorem: Memory derivation
; ZeRO-3 model state = 16Ψ/N with K = 12
;   ∀ Ψ > 0, N ∈ ℤ, N ≥ 1: model_state(ZeRO-3)|K=12 = 16Ψ/N
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (let ((?x0 (to_real N)))
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
(let ((?x1 (/ 1.0 ?x0)))
(let ((?x2 (* (* 16.0 psi) ?x1)))
(not (= ?x2 ?x2))))))
(check-sat)
(exit)
